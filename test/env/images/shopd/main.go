// Command shopd is the sandbox's workload: a small static HTTP server that
// runs as a real container. GET / answers with the pod's name (its host
// name); GET /stream holds the connection open and writes a line every
// 100ms until the client goes, so a prober sees a broken connection the
// moment the process or its network goes away. GET /dns/NAME/ resolves
// NAME through the pod's own resolver (its resolv.conf: the cluster's
// DNS) and answers 200 with the addresses, or 502 with the error, so a
// prober can ask a pod to resolve; GET /dns/NAME/stream is /stream.
//
//	shopd serve [--port=8080]   the app
//	shopd [--port=9901]         the sidecar (the image's default command)
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	args, port := os.Args[1:], 9901
	if len(args) > 0 && args[0] == "serve" {
		args, port = args[1:], 8080
	}
	fs := flag.NewFlagSet("shopd", flag.ExitOnError)
	fs.IntVar(&port, "port", port, "TCP port to serve on")
	_ = fs.Parse(args)
	addr := fmt.Sprintf(":%d", port)
	name, err := os.Hostname()
	if err != nil {
		log.Fatalf("shopd: host name: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, name)
	})
	mux.HandleFunc("GET /dns/{name}/{$}", func(w http.ResponseWriter, r *http.Request) {
		addrs, err := net.DefaultResolver.LookupHost(r.Context(), r.PathValue("name"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprintln(w, strings.Join(addrs, " "))
	})
	stream := func(w http.ResponseWriter, r *http.Request) {
		flusher, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "streaming unsupported", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "%s %d\n", name, i); err != nil {
				return
			}
			flusher.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-t.C:
			}
		}
	}
	mux.HandleFunc("GET /stream", stream)
	mux.HandleFunc("GET /dns/{name}/stream", stream)
	// SIGTERM ends the process at once with status 143 (128+15), as a
	// server killed by it: a stopped pod ends "Failed", not "Succeeded".
	// (Unhandled, the signal would be ignored: shopd is its container's
	// PID 1.)
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-term
		os.Exit(143)
	}()
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("shopd %s serving on %s", name, addr)
	log.Fatalf("shopd: %v", srv.ListenAndServe())
}
