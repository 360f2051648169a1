// Command netpol enforces NetworkPolicies on the local cluster's nodes with the upstream
// kube-network-policies controller (sigs.k8s.io/kube-network-policies/pkg/networkpolicy).
//
// The controller judges every packet handed to its NFQUEUE by both ends' policies (egress of
// the source pod, ingress of the destination), whichever node they are on. Upstream, each node
// runs one and queues its own pods' packets with nftables' queue expression, which this
// sandbox's kernel lacks (the nftables sync logs "no such file or directory" and changes
// nothing). Here every node's pods share the host's network namespace and one bridge, so one
// controller serves them all, and localcluster/network.py queues every new pod-to-pod
// connection to it with iptables' NFQUEUE target. This main only reads a kubeconfig instead of
// in-cluster credentials; the policy logic is all upstream's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of an identity that may list and watch pods, namespaces and networkpolicies")
	node := flag.String("node", "", "node name (upstream: whose pods' packets it queues)")
	queue := flag.Int("queue", 100, "NFQUEUE number to read")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "usage: netpol --kubeconfig FILE --node NAME [--queue N]")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig %s: %v", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	factory := informers.NewSharedInformerFactory(client, 0)
	cfg := networkpolicy.Config{
		NodeName:    *node,
		NFTableName: "fsdplc-netpol",
		QueueID:     *queue,
		// DNS goes to the host here (the cluster DNS is a host process), which the node's own
		// traffic rule lets through anyway; the DNS race this works around is fixed in 6.12.
		NetfilterBug1766Fix: false,
		// NRI on: the nodes' containerd 1.6 has no NRI socket, so the plugin only logs that it
		// cannot connect and pod IPs come from the API server. Off, v0.8.0 dereferences the
		// absent plugin for any packet whose address is no known pod's (a pod just gone, one
		// the informer has not seen yet) and the controller dies: seen beside a busy loop.
		NRIdisabled: false,
		FailOpen:    true, // a full queue passes packets, as iptables' --queue-bypass does
	}
	controller, err := networkpolicy.NewController(client,
		factory.Networking().V1().NetworkPolicies(), factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(), nil, nil, nil, nil, cfg)
	if err != nil {
		klog.Fatalf("controller: %v", err)
	}
	go func() {
		if err := controller.Run(ctx); err != nil {
			klog.Errorf("controller: %v", err)
			cancel()
		}
	}()
	factory.Start(ctx.Done())
	<-ctx.Done()
}
