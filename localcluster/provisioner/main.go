// Command local-dir-provisioner is the local cluster's dynamic volume provisioner: each claim
// of a StorageClass that names it gets a directory of its own under --base-dir, handed to the
// claim as a hostPath PersistentVolume.
//
// Every node of the local cluster is a kubelet on this one machine, so a host directory is
// shared storage: ReadWriteOnce and ReadWriteMany claims alike. Kubernetes applies no fsGroup
// to hostPath volumes, so each directory is made writable by the project's workers (uid and
// gid 1000) here, setgid so that the files in it keep the group.
//
// The sig-storage provisioner library watches the claims, creates the PersistentVolume this
// program describes, and calls Delete once a Released volume's reclaim policy says so. This
// program does not serve block volumes or claims with a selector, and never touches a path
// outside --base-dir.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"
)

const (
	provisionerName = "fsdpoperator.io/local-dir"
	// The uid and gid the project's worker image runs as (docs/images.md).
	workerID = 1000
	dirMode  = os.ModeSetgid | 0o775
)

type dirProvisioner struct {
	base string // absolute and clean: Delete compares paths with it
}

var _ controller.Provisioner = (*dirProvisioner)(nil)

// Provision makes the claim's directory and describes it as a hostPath volume.
func (p *dirProvisioner) Provision(
	_ context.Context, opts controller.ProvisionOptions,
) (*v1.PersistentVolume, controller.ProvisioningState, error) {
	claim := opts.PVC
	if claim.Spec.Selector != nil {
		// As the in-tree provisioners: a selector asks for an existing volume.
		return nil, controller.ProvisioningFinished, fmt.Errorf(
			"%s does not provision claims with spec.selector", provisionerName)
	}
	dir := filepath.Join(p.base, fmt.Sprintf("%s-%s-%s", claim.Namespace, claim.Name, opts.PVName))
	if err := makeWorkerDir(dir); err != nil {
		return nil, controller.ProvisioningFinished, err
	}
	return hostPathVolume(opts, dir), controller.ProvisioningFinished, nil
}

// Delete removes a volume's directory: only ever one directly under the base directory.
func (p *dirProvisioner) Delete(_ context.Context, pv *v1.PersistentVolume) error {
	source := pv.Spec.HostPath
	if source == nil || filepath.Dir(filepath.Clean(source.Path)) != p.base {
		return &controller.IgnoredError{Reason: fmt.Sprintf("%s is not a directory of %s", pv.Name, p.base)}
	}
	return os.RemoveAll(source.Path)
}

func hostPathVolume(opts controller.ProvisionOptions, dir string) *v1.PersistentVolume {
	reclaim := v1.PersistentVolumeReclaimDelete // the API's default for a class
	if opts.StorageClass.ReclaimPolicy != nil {
		reclaim = *opts.StorageClass.ReclaimPolicy
	}
	// The directory exists: "OrCreate" only spares a pod a failed mount should it be removed.
	kind := v1.HostPathDirectoryOrCreate
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: opts.PVC.Spec.AccessModes,
			Capacity: v1.ResourceList{
				v1.ResourceStorage: opts.PVC.Spec.Resources.Requests[v1.ResourceStorage],
			},
			PersistentVolumeReclaimPolicy: reclaim,
			VolumeMode:                    opts.PVC.Spec.VolumeMode,
			PersistentVolumeSource: v1.PersistentVolumeSource{
				HostPath: &v1.HostPathVolumeSource{Path: dir, Type: &kind},
			},
		},
	}
}

// makeWorkerDir creates dir (or keeps it, on a retried Provision) owned by the workers.
func makeWorkerDir(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if err := os.Chown(dir, workerID, workerID); err != nil {
		return err
	}
	// Mkdir's mode goes through the umask and cannot set setgid; Chmod sets it exactly.
	return os.Chmod(dir, dirMode)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to serve (required)")
	baseDir := flag.String("base-dir", "", "directory that holds one directory per volume (required)")
	metrics := flag.String("metrics-address", "", "host:port serving Prometheus /metrics; off when empty")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*kubeconfig, *baseDir, *metrics); err != nil {
		klog.ErrorS(err, "local-dir-provisioner")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}

// run serves claims until SIGTERM or SIGINT.
func run(kubeconfig, baseDir, metricsAddress string) error {
	if kubeconfig == "" || baseDir == "" {
		return errors.New("--kubeconfig and --base-dir are required")
	}
	base, err := filepath.Abs(baseDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	options, err := metricsOptions(metricsAddress)
	if err != nil {
		return err
	}
	// One provisioner per cluster, started and stopped with it: there is nothing to elect.
	options = append(options, controller.LeaderElection(false))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	provisioner := &dirProvisioner{base: base}
	controller.NewProvisionController(ctx, client, provisionerName, provisioner, options...).Run(ctx)
	return nil
}

func metricsOptions(address string) ([]func(*controller.ProvisionController) error, error) {
	if address == "" {
		return nil, nil
	}
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address %q: %w", address, err)
	}
	number, err := strconv.ParseInt(port, 10, 32)
	if err != nil || number <= 0 {
		return nil, fmt.Errorf("--metrics-address %q: the port must be a number above 0", address)
	}
	return []func(*controller.ProvisionController) error{
		controller.MetricsAddress(host), controller.MetricsPort(int32(number)),
	}, nil
}
