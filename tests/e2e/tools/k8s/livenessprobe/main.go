// Command livenessprobe serves /healthz by calling the CSI driver's Probe, the job of the
// livenessprobe sidecar, which the Go module proxy reachable here does not serve. Same
// flags as the sidecar the chart runs, so the e2e test can install the chart unchanged.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the driver's CSI socket")
	endpoint := flag.String("http-endpoint", ":9808", "address to serve /healthz on")
	timeout := flag.Duration("probe-timeout", time.Second, "deadline of one Probe call")
	flag.Int("v", 0, "log verbosity (accepted for livenessprobe compatibility)")
	flag.Parse()

	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("connecting to %s: %v", *csiAddress, err)
	}
	identity := csi.NewIdentityClient(conn)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		resp, err := identity.Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		case resp.GetReady() != nil && !resp.GetReady().GetValue():
			http.Error(w, "driver responded but is not ready", http.StatusInternalServerError)
		default:
			w.Write([]byte("ok"))
		}
	})
	log.Printf("serving /healthz on %s for %s", *endpoint, *csiAddress)
	log.Fatal(http.ListenAndServe(*endpoint, nil))
}
