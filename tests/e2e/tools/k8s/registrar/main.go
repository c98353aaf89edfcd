// Command registrar registers a CSI driver with the kubelet's plugin watcher, the job
// node-driver-registrar does in a cluster. The Go module proxy reachable here does not
// serve node-driver-registrar, so the e2e tests use this: the same protocol, through the
// kubelet's own pluginregistration API at the pinned Kubernetes release, the same flags,
// and the same health check: --http-endpoint serves /healthz, 200 while the registration
// socket answers GetInfo with the driver's name (node-driver-registrar v2.18.0,
// cmd/csi-node-driver-registrar/node_register.go, httpServer and
// checkLiveRegistrationSocket). --mode=kubelet-registration-probe exits 0 without doing
// anything, as upstream has since v2.9.0 (CHANGELOG-2.9.md).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	driverName string
	endpoint   string
}

func (s *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.driverName,
		Endpoint:          s.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(_ context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !status.PluginRegistered {
		// node-driver-registrar exits here too, so the pod restarts and registers again.
		log.Fatalf("kubelet refused the registration: %s", status.Error)
	}
	log.Printf("registered with the kubelet")
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	csiAddress := flag.String("csi-address", "", "the driver's CSI socket, as this process reaches it")
	kubeletPath := flag.String("kubelet-registration-path", "", "the driver's CSI socket, as the kubelet reaches it")
	registryDir := flag.String("plugin-registration-path", "/registration", "the kubelet's plugins_registry directory")
	mode := flag.String("mode", "registration", `deprecated upstream: "kubelet-registration-probe" exits 0 at once`)
	httpEndpoint := flag.String("http-endpoint", "", "address of the /healthz server (e.g. :9821); empty: none")
	flag.Int("v", 0, "log verbosity (accepted for node-driver-registrar compatibility)")
	flag.Parse()
	if *kubeletPath == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	switch *mode {
	case "kubelet-registration-probe":
		return
	case "registration":
	default:
		log.Fatalf("unknown --mode %q", *mode)
	}
	if *csiAddress == "" {
		log.Fatal("--csi-address is required")
	}

	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("connecting to %s: %v", *csiAddress, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	cancel()
	if err != nil {
		log.Fatalf("GetPluginInfo on %s: %v", *csiAddress, err)
	}
	conn.Close()

	socket := filepath.Join(*registryDir, info.Name+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing stale %s: %v", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listening on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, &registrationServer{driverName: info.Name, endpoint: *kubeletPath})
	if *httpEndpoint != "" {
		go serveHealthz(*httpEndpoint, socket, info.Name)
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-signals
		server.Stop()
		os.Remove(socket)
		os.Exit(0)
	}()
	log.Printf("serving registration for %s at %s", info.Name, socket)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
}

// serveHealthz answers /healthz with 200 while the registration socket answers GetInfo
// with this driver's name, else 500 (404 when the socket is gone), as upstream does.
func serveHealthz(endpoint, socket, driverName string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if _, err := os.Stat(socket); err != nil {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte("registration socket does not exist"))
			return
		}
		if err := checkRegistrationSocket(socket, driverName); err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(err.Error()))
			return
		}
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("ok"))
	})
	log.Fatal(http.ListenAndServe(endpoint, mux))
}

func checkRegistrationSocket(socket, driverName string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to %s: %v", socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo on %s: %v", socket, err)
	}
	if info.Name != driverName {
		return fmt.Errorf("invalid driver name %s", info.Name)
	}
	return nil
}
