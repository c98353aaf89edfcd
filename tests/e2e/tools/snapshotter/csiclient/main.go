// csiclient is what the kubelet e2e uses to act as another node's kubelet and provisioner
// towards a driver that no kubelet runs: it calls the CSI RPCs on a unix socket directly.
//
//	csiclient SOCKET restore NAME BYTES NODE SNAPSHOT_ID STAGING TARGET KEY=VALUE...
//	    CreateVolume from the snapshot (content source), in NODE's topology segment
//	    (<driver>/node=NODE), with the KEY=VALUEs as class parameters, then NodeStageVolume
//	    at STAGING and NodePublishVolume at TARGET (ext4, single-node writer). Prints the
//	    volume id.
//	csiclient SOCKET release VOLUME_ID STAGING TARGET
//	    NodeUnpublishVolume, NodeUnstageVolume, DeleteVolume.
//	csiclient SOCKET list-snapshot SNAPSHOT_ID
//	    ListSnapshots for that id; prints "<id> <source volume> <size> <ready>" per entry.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	if len(os.Args) < 3 {
		fail(fmt.Errorf("usage: csiclient SOCKET restore|release|list-snapshot ARGS..."))
	}
	conn, err := grpc.NewClient("unix://"+os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	// A restore copies the snapshot at NodeStage; the e2e's claims are small.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := os.Args[3:]
	switch os.Args[2] {
	case "restore":
		err = restore(ctx, conn, args)
	case "release":
		err = release(ctx, conn, args)
	case "list-snapshot":
		err = listSnapshot(ctx, conn, args)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[2])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "csiclient:", err)
	os.Exit(1)
}

var capability = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func restore(ctx context.Context, conn *grpc.ClientConn, args []string) error {
	if len(args) < 6 {
		return fmt.Errorf("restore NAME BYTES NODE SNAPSHOT_ID STAGING TARGET KEY=VALUE...")
	}
	name, node, snapshot, staging, target := args[0], args[2], args[3], args[4], args[5]
	size, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil {
		return err
	}
	params := map[string]string{}
	for _, kv := range args[6:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("parameter %q is not KEY=VALUE", kv)
		}
		params[k] = v
	}
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return err
	}
	segment := &csi.Topology{Segments: map[string]string{info.Name + "/node": node}}
	created, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{capability},
		Parameters:         params,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapshot},
		}},
		AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{segment},
			Preferred: []*csi.Topology{segment},
		},
	})
	if err != nil {
		return fmt.Errorf("CreateVolume: %w", err)
	}
	vol := created.GetVolume()
	nodes := csi.NewNodeClient(conn)
	if _, err := nodes.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId:          vol.VolumeId,
		StagingTargetPath: staging,
		VolumeCapability:  capability,
		VolumeContext:     vol.VolumeContext,
	}); err != nil {
		return fmt.Errorf("NodeStageVolume %s: %w", vol.VolumeId, err)
	}
	if _, err := nodes.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId:          vol.VolumeId,
		StagingTargetPath: staging,
		TargetPath:        target,
		VolumeCapability:  capability,
		VolumeContext:     vol.VolumeContext,
	}); err != nil {
		return fmt.Errorf("NodePublishVolume %s: %w", vol.VolumeId, err)
	}
	fmt.Println(vol.VolumeId)
	return nil
}

func release(ctx context.Context, conn *grpc.ClientConn, args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("release VOLUME_ID STAGING TARGET")
	}
	id, staging, target := args[0], args[1], args[2]
	node := csi.NewNodeClient(conn)
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		return fmt.Errorf("NodeUnpublishVolume: %w", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		return fmt.Errorf("NodeUnstageVolume: %w", err)
	}
	if _, err := csi.NewControllerClient(conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		return fmt.Errorf("DeleteVolume: %w", err)
	}
	return nil
}

func listSnapshot(ctx context.Context, conn *grpc.ClientConn, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("list-snapshot SNAPSHOT_ID")
	}
	resp, err := csi.NewControllerClient(conn).ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: args[0]})
	if err != nil {
		return fmt.Errorf("ListSnapshots: %w", err)
	}
	for _, e := range resp.Entries {
		s := e.GetSnapshot()
		fmt.Println(s.SnapshotId, s.SourceVolumeId, s.SizeBytes, s.ReadyToUse)
	}
	return nil
}
