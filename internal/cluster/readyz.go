package cluster

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Readyz asks the API server at addr (on the kubeconfig's port) for
// /readyz, its certificate verified against the kubeconfig's CA for the
// name the kubeconfig uses (every API server's certificate names the
// cluster's endpoint) or, when it does not name that, for addr itself
// (an API server's certificate names its own address; a kubeconfig that
// names one API server directly does not match the others).
func Readyz(ctx context.Context, cfg *rest.Config, addr string) error {
	err := readyzAs(ctx, cfg, addr, "")
	var hostErr x509.HostnameError
	if errors.As(err, &hostErr) {
		return readyzAs(ctx, cfg, addr, addr)
	}
	return err
}

// apiserverURL is the API server at addr (an IPv4 or IPv6 address, or a
// name) on the port of the kubeconfig's server URL (none: https's).
func apiserverURL(kubeconfigHost, addr string) string {
	port := ""
	if u, err := url.Parse(kubeconfigHost); err == nil && u.Host != "" {
		port = u.Port()
	} else if _, p, err := net.SplitHostPort(kubeconfigHost); err == nil {
		port = p // HOST:PORT with no scheme
	}
	if port == "" {
		port = "443"
	}
	return "https://" + net.JoinHostPort(addr, port)
}

func readyzAs(ctx context.Context, cfg *rest.Config, addr, serverName string) error {
	c := rest.CopyConfig(cfg)
	host := c.Host
	c.Host = apiserverURL(host, addr)
	if port := inClusterPort(ctx, cfg); port != "" {
		c.Host = "https://" + net.JoinHostPort(addr, port)
	}
	switch {
	case serverName != "":
		c.TLSClientConfig.ServerName = serverName
	case c.TLSClientConfig.ServerName == "":
		// Verify the certificate against the name the kubeconfig uses.
		if u, err := url.Parse(host); err == nil {
			c.TLSClientConfig.ServerName = u.Hostname()
		}
	}
	c.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return err
	}
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Host, err)
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("%s: %s", c.Host, body)
	}
	return nil
}

// inClusterPorts caches inClusterPort's answer per service address.
var inClusterPorts sync.Map

// inClusterPort is, for a config made in a pod (rest.InClusterConfig:
// the kubernetes Service's address, $KUBERNETES_SERVICE_HOST), the API
// servers' own port, which the Service's port is not: the port named
// https of the Service's EndpointSlice. "" for any other config, or when
// it cannot be read (the config's port is tried then).
func inClusterPort(ctx context.Context, cfg *rest.Config) string {
	svc := os.Getenv("KUBERNETES_SERVICE_HOST")
	if svc == "" {
		return ""
	}
	u, err := url.Parse(cfg.Host)
	if err != nil || u.Hostname() != svc {
		return ""
	}
	if p, ok := inClusterPorts.Load(cfg.Host); ok {
		return p.(string)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return ""
	}
	eps, err := cs.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=kubernetes"})
	if err != nil {
		return ""
	}
	for _, sl := range eps.Items {
		for _, p := range sl.Ports {
			if p.Name != nil && *p.Name == "https" && p.Port != nil && *p.Port > 0 {
				port := strconv.Itoa(int(*p.Port))
				inClusterPorts.Store(cfg.Host, port)
				return port
			}
		}
	}
	return ""
}
