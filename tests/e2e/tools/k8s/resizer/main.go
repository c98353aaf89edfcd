// Command resizer expands the driver's volumes, the job external-resizer does in a
// cluster. The Go module proxy reachable here refuses github.com/kubernetes-csi/external-resizer
// (403 at every version), so the e2e tests use this: the same CSI call and the same API
// writes, in the same order, as external-resizer v2.2.1 with RecoverVolumeExpansionFailure
// (GA there, pkg/features/features.go:64) makes them for a CSI driver with controller
// EXPAND_VOLUME. Each step cites its source (kubernetes-csi/external-resizer at tag v2.2.1,
// 32c003db). What it leaves out: the trivial resizer (drivers without controller
// EXPAND_VOLUME), CSI migration, expand secrets, in-use errors, shrinking a claim back
// (recovery), VolumeAttributesClass, leader election. It polls claims each second instead
// of running informers; retries back off from 1 s to 5 min as upstream's work queue does
// (cmd/csi-resizer/main.go:73-74, 239).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
)

// Event reasons and the annotation, as pkg/util/events.go:21-28 and pkg/util/util.go:52 name them.
const (
	reasonResizing       = "Resizing"
	reasonResizeFailed   = "VolumeResizeFailed"
	reasonResizeSuccess  = "VolumeResizeSuccessful"
	reasonFSResizeNeeded = "FileSystemResizeRequired"
	annNodeNotRequired   = "volume.kubernetes.io/node-expansion-not-required"
)

// The resize conditions that a merge replaces or drops (pkg/util/util.go:39-44).
var resizeConditions = map[v1.PersistentVolumeClaimConditionType]bool{
	v1.PersistentVolumeClaimResizing:                true,
	v1.PersistentVolumeClaimFileSystemResizePending: true,
	v1.PersistentVolumeClaimControllerResizeError:   true,
	v1.PersistentVolumeClaimNodeResizeError:         true,
}

type resizer struct {
	kube        kubernetes.Interface
	csi         csi.ControllerClient
	driver      string
	timeout     time.Duration
	multiWriter bool
	events      record.EventRecorder
	// Per-claim retry state: upstream's exponential failure rate limiter.
	delay map[types.UID]time.Duration
	next  map[types.UID]time.Time
}

func main() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the driver's CSI socket")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file; empty: in-cluster")
	timeout := flag.Duration("timeout", 10*time.Second, "timeout of each CSI call")
	httpEndpoint := flag.String("http-endpoint", "", "address of the /healthz and /metrics server; empty: none")
	leaderElection := flag.Bool("leader-election", false, "accepted for external-resizer compatibility; must be false")
	flag.Int("v", 0, "log verbosity (accepted for external-resizer compatibility)")
	flag.Parse()
	if *leaderElection {
		log.Fatal("--leader-election is not supported by this stand-in")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if *kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		log.Fatalf("kubernetes client config: %v", err)
	}
	kube := kubernetes.NewForConfigOrDie(cfg)
	conn, err := grpc.NewClient("unix://"+*csiAddress, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("connecting to %s: %v", *csiAddress, err)
	}
	r := &resizer{kube: kube, csi: csi.NewControllerClient(conn), timeout: *timeout,
		delay: map[types.UID]time.Duration{}, next: map[types.UID]time.Time{}}
	r.probe(conn)
	// One recorder, component "external-resizer <driver>" (pkg/controller/controller.go:102-103).
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	r.events = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "external-resizer " + r.driver})
	if *httpEndpoint != "" {
		http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })
		http.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {})
		go func() { log.Fatal(http.ListenAndServe(*httpEndpoint, nil)) }()
	}
	log.Printf("resizing volumes of %s", r.driver)
	for {
		r.pass()
		time.Sleep(time.Second)
	}
}

// probe waits for the driver (main.go:167 getDriverName, with the socket's wait) and
// requires controller EXPAND_VOLUME (pkg/resizer/csi_resizer.go:59-74); it records
// SINGLE_NODE_MULTI_WRITER, which picks the access mode sent (csi_resizer.go:195-199).
func (r *resizer) probe(conn *grpc.ClientConn) {
	ids := csi.NewIdentityClient(conn)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
		info, err := ids.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			r.driver = info.GetName()
			break
		}
		log.Printf("waiting for the driver: %v", err)
		time.Sleep(time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	caps, err := r.csi.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		log.Fatalf("ControllerGetCapabilities: %v", err)
	}
	expand := false
	for _, c := range caps.GetCapabilities() {
		switch c.GetRpc().GetType() {
		case csi.ControllerServiceCapability_RPC_EXPAND_VOLUME:
			expand = true
		case csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER:
			r.multiWriter = true
		}
	}
	if !expand {
		log.Fatalf("%s has no controller EXPAND_VOLUME; this stand-in does only that path", r.driver)
	}
}

// pass looks at every claim once; a claim whose last attempt failed waits its turn.
func (r *resizer) pass() {
	ctx := context.Background()
	claims, err := r.kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		log.Printf("listing claims: %v", err)
		return
	}
	for i := range claims.Items {
		pvc := &claims.Items[i]
		if time.Now().Before(r.next[pvc.UID]) {
			continue
		}
		if err := r.sync(ctx, pvc); err != nil {
			d := min(max(2*r.delay[pvc.UID], time.Second), 5*time.Minute)
			r.delay[pvc.UID], r.next[pvc.UID] = d, time.Now().Add(d)
			log.Printf("claim %s/%s: %v (retry in %s)", pvc.Namespace, pvc.Name, err, d)
		} else {
			delete(r.delay, pvc.UID)
			delete(r.next, pvc.UID)
		}
	}
}

// sync: pkg/controller/controller.go:337-402 (syncPVC) and expand_and_recover.go:35-201.
func (r *resizer) sync(ctx context.Context, pvc *v1.PersistentVolumeClaim) error {
	// pvcNeedResize (controller.go:404-416): bound, and asking for more than it has.
	want := pvc.Spec.Resources.Requests[v1.ResourceStorage]
	has := pvc.Status.Capacity[v1.ResourceStorage]
	if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" || want.Cmp(has) <= 0 {
		return nil
	}
	pv, err := r.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("PV %s: %w", pvc.Spec.VolumeName, err)
	}
	// pvCanBeExpanded (expand_and_recover.go:293-304, csi_resizer.go:104-124): our driver's
	// PV, bound to this claim.
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.driver || pv.Spec.ClaimRef == nil ||
		pv.Spec.ClaimRef.UID != pvc.UID {
		return nil
	}
	pvSize := pv.Spec.Capacity[v1.ResourceStorage]
	state := pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage]
	allocated, hasAllocated := pvc.Status.AllocatedResources[v1.ResourceStorage]
	newSize := want
	// The node's part is pending or running: the kubelet finishes it
	// (expand_and_recover.go:77-89 and 116-120).
	if state == v1.PersistentVolumeClaimNodeResizePending || state == v1.PersistentVolumeClaimNodeResizeInProgress {
		if pvSize.Cmp(want) >= 0 {
			return nil
		}
		if hasAllocated {
			newSize = allocated
		}
		if pvSize.Cmp(newSize) >= 0 {
			return nil
		}
	}
	// The same size again leaves the status as it is (expand_and_recover.go:157-166).
	updateStatus := !hasAllocated || allocated.Cmp(newSize) != 0
	if pvc, err = r.markControllerResizeInProgress(ctx, pvc, newSize, updateStatus); err != nil {
		return fmt.Errorf("marking the claim as resizing: %w", err)
	}
	// expand_and_recover.go:182-184.
	r.events.Event(pvc, v1.EventTypeNormal, reasonResizing, "External resizer is resizing volume "+pv.Name)
	return r.callResizeOnPlugin(ctx, pvc, pv, newSize)
}

// callResizeOnPlugin: expand_and_recover.go:232-290.
func (r *resizer) callResizeOnPlugin(ctx context.Context, pvc *v1.PersistentVolumeClaim, pv *v1.PersistentVolume, newSize resource.Quantity) error {
	capacity, nodeRequired, err := r.expand(ctx, pv, newSize)
	if err != nil {
		// expand_and_recover.go:193-196: every failed attempt is a warning on the claim.
		r.events.Event(pvc, v1.EventTypeWarning, reasonResizeFailed, err.Error())
		if isFinal(err) {
			// markControllerExpansionInfeasible / markControllerExpansionFailedCondition
			// (resize_status.go:105-162): an infeasible error also says so in the status.
			newPVC := pvc.DeepCopy()
			if isInfeasible(err) {
				setStorageStatus(newPVC, v1.PersistentVolumeClaimControllerResizeInfeasible)
			}
			newPVC.Status.Conditions = mergeResizeConditions(newPVC.Status.Conditions, []v1.PersistentVolumeClaimCondition{{
				Type: v1.PersistentVolumeClaimControllerResizeError, Status: v1.ConditionTrue,
				LastTransitionTime: metav1.Now(), Message: fmt.Sprintf("failed to expand pvc with %v", err),
			}}, true)
			if _, perr := r.patchClaim(ctx, pvc, newPVC, false); perr != nil {
				return fmt.Errorf("resizing failed with %v, and recording it with %w", err, perr)
			}
		}
		return fmt.Errorf("resize volume %q failed: %w", pv.Name, err)
	}
	// updatePVCapacity (controller.go:623-647): the capacity the driver answered.
	newPV := pv.DeepCopy()
	newPV.Spec.Capacity[v1.ResourceStorage] = *resource.NewQuantity(capacity, resource.BinarySI)
	if err := r.patchPV(ctx, pv, newPV); err != nil {
		return fmt.Errorf("updating the capacity of PV %s: %w", pv.Name, err)
	}
	if nodeRequired {
		return r.markForPendingNodeExpansion(ctx, pvc)
	}
	return r.markOverallExpansionAsFinished(ctx, pvc, *resource.NewQuantity(capacity, resource.BinarySI))
}

// expand: pkg/resizer/csi_resizer.go:132-192, the capability as GetVolumeCapabilities
// (csi_resizer.go:204-239) builds it.
func (r *resizer) expand(ctx context.Context, pv *v1.PersistentVolume, size resource.Quantity) (int64, bool, error) {
	capability := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: accessMode(pv.Spec.AccessModes, r.multiWriter)}}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == v1.PersistentVolumeBlock {
		capability.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		capability.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}}
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.csi.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
		VolumeId:         pv.Spec.CSI.VolumeHandle,
		CapacityRange:    &csi.CapacityRange{RequiredBytes: size.Value()},
		VolumeCapability: capability,
	})
	if err != nil {
		return 0, false, err
	}
	return resp.GetCapacityBytes(), resp.GetNodeExpansionRequired(), nil
}

// accessMode: csi-lib-utils accessmodes.ToCSIAccessMode for one Kubernetes mode.
func accessMode(modes []v1.PersistentVolumeAccessMode, multiWriter bool) csi.VolumeCapability_AccessMode_Mode {
	if len(modes) != 1 {
		return csi.VolumeCapability_AccessMode_UNKNOWN
	}
	switch modes[0] {
	case v1.ReadWriteOnce:
		if multiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case v1.ReadWriteOncePod:
		if multiWriter {
			return csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
		return csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case v1.ReadOnlyMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case v1.ReadWriteMany:
		return csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	}
	return csi.VolumeCapability_AccessMode_UNKNOWN
}

// isFinal: pkg/util/util.go:242-264. Anything but these codes means the operation is not in progress.
func isFinal(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

// isInfeasible: pkg/util/util.go:269-286.
func isInfeasible(err error) bool {
	st, ok := status.FromError(err)
	return ok && (st.Code() == codes.InvalidArgument || st.Code() == codes.OutOfRange || st.Code() == codes.NotFound)
}

// markControllerResizeInProgress: resize_status.go:31-67.
func (r *resizer) markControllerResizeInProgress(ctx context.Context, pvc *v1.PersistentVolumeClaim, size resource.Quantity, updateStatus bool) (*v1.PersistentVolumeClaim, error) {
	newPVC := pvc.DeepCopy()
	newPVC.Status.Conditions = mergeResizeConditions(newPVC.Status.Conditions, []v1.PersistentVolumeClaimCondition{{
		Type: v1.PersistentVolumeClaimResizing, Status: v1.ConditionTrue, LastTransitionTime: metav1.Now(),
	}}, !updateStatus)
	delete(newPVC.Annotations, annNodeNotRequired)
	if updateStatus {
		setStorageStatus(newPVC, v1.PersistentVolumeClaimControllerResizeInProgress)
	}
	if newPVC.Status.AllocatedResources == nil {
		newPVC.Status.AllocatedResources = v1.ResourceList{}
	}
	newPVC.Status.AllocatedResources[v1.ResourceStorage] = size
	return r.patchClaim(ctx, pvc, newPVC, true)
}

// markForPendingNodeExpansion: resize_status.go:71-103.
func (r *resizer) markForPendingNodeExpansion(ctx context.Context, pvc *v1.PersistentVolumeClaim) error {
	newPVC := pvc.DeepCopy()
	newPVC.Status.Conditions = mergeResizeConditions(newPVC.Status.Conditions, []v1.PersistentVolumeClaimCondition{{
		Type: v1.PersistentVolumeClaimFileSystemResizePending, Status: v1.ConditionTrue, LastTransitionTime: metav1.Now(),
		Message: "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
	}}, true)
	delete(newPVC.Annotations, annNodeNotRequired)
	setStorageStatus(newPVC, v1.PersistentVolumeClaimNodeResizePending)
	if _, err := r.patchClaim(ctx, pvc, newPVC, true); err != nil {
		return fmt.Errorf("mark PVC as node expansion required failed: %w", err)
	}
	r.events.Event(pvc, v1.EventTypeNormal, reasonFSResizeNeeded, "Require file system resize of volume on node")
	return nil
}

// markOverallExpansionAsFinished: resize_status.go:164-198.
func (r *resizer) markOverallExpansionAsFinished(ctx context.Context, pvc *v1.PersistentVolumeClaim, size resource.Quantity) error {
	newPVC := pvc.DeepCopy()
	newPVC.Status.Capacity[v1.ResourceStorage] = size
	newPVC.Status.Conditions = mergeResizeConditions(pvc.Status.Conditions, nil, false)
	delete(newPVC.Status.AllocatedResourceStatuses, v1.ResourceStorage)
	if len(newPVC.Status.AllocatedResourceStatuses) == 0 {
		newPVC.Status.AllocatedResourceStatuses = nil
	}
	if newPVC.Annotations == nil {
		newPVC.Annotations = map[string]string{}
	}
	newPVC.Annotations[annNodeNotRequired] = "true"
	if _, err := r.patchClaim(ctx, pvc, newPVC, true); err != nil {
		return fmt.Errorf("mark PVC as resize finished failed: %w", err)
	}
	r.events.Event(pvc, v1.EventTypeNormal, reasonResizeSuccess, "Resize volume succeeded")
	return nil
}

func setStorageStatus(pvc *v1.PersistentVolumeClaim, s v1.ClaimResourceStatus) {
	if pvc.Status.AllocatedResourceStatuses == nil {
		pvc.Status.AllocatedResourceStatuses = map[v1.ResourceName]v1.ClaimResourceStatus{}
	}
	pvc.Status.AllocatedResourceStatuses[v1.ResourceStorage] = s
}

// mergeResizeConditions: pkg/util/util.go:57-88.
func mergeResizeConditions(old, add []v1.PersistentVolumeClaimCondition, keepOld bool) []v1.PersistentVolumeClaimCondition {
	byType := map[v1.PersistentVolumeClaimConditionType]v1.PersistentVolumeClaimCondition{}
	for _, c := range add {
		byType[c.Type] = c
	}
	var out []v1.PersistentVolumeClaimCondition
	for _, c := range old {
		if !resizeConditions[c.Type] {
			out = append(out, c)
		} else if n, ok := byType[c.Type]; ok {
			out = append(out, n)
			delete(byType, c.Type)
		} else if keepOld {
			out = append(out, c)
		}
	}
	for _, c := range add {
		if n, ok := byType[c.Type]; ok {
			out = append(out, n)
		}
	}
	return out
}

// patchClaim: pkg/util/util.go:129-160 and 216-228, a strategic merge patch of the status
// subresource, with the old resourceVersion when checkVersion (a stale copy then fails).
func (r *resizer) patchClaim(ctx context.Context, old, updated *v1.PersistentVolumeClaim, checkVersion bool) (*v1.PersistentVolumeClaim, error) {
	patch, err := twoWay(old, updated, v1.PersistentVolumeClaim{})
	if err != nil {
		return old, err
	}
	if checkVersion {
		var m map[string]any
		if err := json.Unmarshal(patch, &m); err != nil {
			return old, err
		}
		meta, _ := m["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta["resourceVersion"] = old.ResourceVersion
		m["metadata"] = meta
		if patch, err = json.Marshal(m); err != nil {
			return old, err
		}
	}
	return r.kube.CoreV1().PersistentVolumeClaims(old.Namespace).Patch(ctx, old.Name, types.StrategicMergePatchType,
		patch, metav1.PatchOptions{}, "status")
}

// patchPV: controller.go:669-683.
func (r *resizer) patchPV(ctx context.Context, old, updated *v1.PersistentVolume) error {
	patch, err := twoWay(old, updated, v1.PersistentVolume{})
	if err != nil {
		return err
	}
	_, err = r.kube.CoreV1().PersistentVolumes().Patch(ctx, old.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	return err
}

// twoWay: GetPatchData (pkg/util/util.go:163-179).
func twoWay(old, updated, kind any) ([]byte, error) {
	a, err := json.Marshal(old)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(updated)
	if err != nil {
		return nil, err
	}
	return strategicpatch.CreateTwoWayMergePatch(a, b, kind)
}
