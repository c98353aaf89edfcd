// Command registrar registers a CSI driver with the kubelet's plugin watcher, the job
// node-driver-registrar does in a cluster. The Go module proxy reachable here does not
// serve node-driver-registrar, so the e2e tests use this: the same protocol, through the
// kubelet's own pluginregistration API at the pinned Kubernetes release, the same flags,
// and the same liveness probe (--mode=kubelet-registration-probe checks for the file it
// writes next to --kubelet-registration-path when the kubelet fetches its info).
package main

import (
	"context"
	"flag"
	"log"
	"net"
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
	probeFile  string
}

func (s *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	if err := os.MkdirAll(filepath.Dir(s.probeFile), 0o755); err != nil {
		log.Printf("creating the registration probe file: %v", err)
	} else if f, err := os.Create(s.probeFile); err != nil {
		log.Printf("creating the registration probe file: %v", err)
	} else {
		f.Close()
	}
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
	mode := flag.String("mode", "registration", `"registration", or "kubelet-registration-probe" to exit 0 once registered`)
	flag.Int("v", 0, "log verbosity (accepted for node-driver-registrar compatibility)")
	flag.Parse()
	if *kubeletPath == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	probeFile := filepath.Join(filepath.Dir(*kubeletPath), "registration")
	switch *mode {
	case "kubelet-registration-probe":
		if info, err := os.Stat(probeFile); err != nil || !info.Mode().IsRegular() {
			log.Fatalf("kubelet plugin registration has not succeeded yet: no file %s", probeFile)
		}
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
	registerapi.RegisterRegistrationServer(server, &registrationServer{driverName: info.Name, endpoint: *kubeletPath, probeFile: probeFile})

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
