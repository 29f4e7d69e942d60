package cluster

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"k8s.io/client-go/rest"
)

// Readyz verifies each API server's certificate for the kubeconfig's name
// or, when it does not carry that name (a kubeconfig naming one API server
// directly), for the server's own address; never without verifying.
func TestReadyzVerifiesForTheNameOrTheAddress(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			_, _ = w.Write([]byte("ok"))
		}
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	for _, tc := range []struct {
		name, host string
		ca         []byte
		ok         bool
	}{
		{"the kubeconfig's name", "example.com", ca, true}, // the test certificate's name
		{"another name: the address", "api.cluster.invalid", ca, true},
		{"an unknown CA", "example.com", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &rest.Config{Host: "https://" + tc.host + ":" + port, TLSClientConfig: rest.TLSClientConfig{CAData: tc.ca}}
			err := Readyz(context.Background(), cfg, "127.0.0.1")
			if (err == nil) != tc.ok {
				t.Fatalf("readyz: %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// The API server at a node's address, on the kubeconfig's port: an IPv6
// address goes in brackets (concatenated, "https://fd00::1:6443" named no
// port at all).
func TestAPIServerURL(t *testing.T) {
	for _, tc := range []struct{ kubeconfig, addr, want string }{
		{"https://10.0.0.1:6443", "10.0.0.2", "https://10.0.0.2:6443"},
		{"https://[fd00::1]:6443", "fd00::2", "https://[fd00::2]:6443"},
		{"https://cluster.example:8443", "fd00::2", "https://[fd00::2]:8443"},
		{"https://cluster.example", "10.0.0.2", "https://10.0.0.2:443"},
		{"https://[fd00::1]", "fd00::2", "https://[fd00::2]:443"},
		{"10.0.0.1:6443", "10.0.0.2", "https://10.0.0.2:6443"},
	} {
		if got := apiserverURL(tc.kubeconfig, tc.addr); got != tc.want {
			t.Errorf("apiserverURL(%q, %q) = %q, want %q", tc.kubeconfig, tc.addr, got, tc.want)
		}
	}
}

// In a pod, the config names the kubernetes Service (its port is not the
// API servers'): each API server's /readyz is asked on the port of the
// Service's EndpointSlice.
func TestReadyzInAPodUsesTheAPIServersPort(t *testing.T) {
	// The API server itself, on its own port; the "Service" answers
	// the EndpointSlice list only.
	apiserver := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			_, _ = w.Write([]byte("ok"))
		}
	}))
	defer apiserver.Close()
	_, port, _ := net.SplitHostPort(apiserver.Listener.Addr().String())
	service := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices" || r.URL.Query().Get("labelSelector") != "kubernetes.io/service-name=kubernetes" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"EndpointSliceList","apiVersion":"discovery.k8s.io/v1","items":[{"metadata":{"name":"kubernetes"},"addressType":"IPv4","endpoints":[{"addresses":["127.0.0.1"]}],"ports":[{"name":"https","port":` + port + `,"protocol":"TCP"}]}]}`))
	}))
	defer service.Close()
	svcHost, svcPort, _ := net.SplitHostPort(service.Listener.Addr().String())
	// Both serve the same test certificate (127.0.0.1, example.com).
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: service.Certificate().Raw})
	cfg := &rest.Config{Host: "https://" + net.JoinHostPort(svcHost, svcPort), TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	t.Setenv("KUBERNETES_SERVICE_HOST", "localhost") // another config's
	if err := Readyz(context.Background(), cfg, "127.0.0.1"); err == nil {
		t.Fatal("the Service's port answered /readyz: the test proves nothing")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", svcHost)
	if err := Readyz(context.Background(), cfg, "127.0.0.1"); err != nil {
		t.Fatalf("in a pod: %v", err)
	}
}
