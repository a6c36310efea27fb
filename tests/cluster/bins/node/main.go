// Command cwsandbox-node is the test cluster's node: one process that registers one or more
// Nodes with a real kube-apiserver (virtual-kubelet's node/nodeutil: Node object, Lease
// heartbeats, the pod controller) and runs each pod's containers as local bubblewrap sandboxes.
//
// Each node serves the kubelet API over TLS (exec, attach, logs) for the apiserver's proxy,
// requiring a client certificate signed by --client-ca. A node started with the ":websocket"
// suffix declares ExtendWebSocketsToKubelet in status.declaredFeatures, so a 1.37 apiserver
// passes WebSocket exec straight through to it, and the node translates the WebSocket to SPDY
// itself as a 1.37 kubelet does; other nodes get SPDY from the apiserver's stream translator.
//
// A plain-HTTP control endpoint on loopback (--control) lets tests ask for faults:
//
//	POST /pods/{namespace}/{name}/evict   the kubelet evicts the pod (Failed, Evicted, DisruptionTarget)
//	POST /pods/{namespace}/{name}/oom     the container is OOM-killed (Failed, OOMKilled, 137)
//	POST /pods/{namespace}/{name}/kill    PID 1 gets SIGKILL (the container terminates with 137, Error)
//	GET  /pods/{namespace}/{name}/processes   processes in the pod's containers besides PID 1
//	POST /nodes/{name}/ready?value=false  the node reports Ready=False (true: back to Ready)
//	GET  /stats                           exec counts per node and per transport, pods per node
//	GET  /healthz                         200 once every node is registered and ready
//
// An image-pull failure comes from the image name, as on the project's test server:
// "registry.invalid/..." or a name containing "fault-imagepull"; "fault-evict[:s]",
// "fault-oom[:s]" end the pod s seconds after it runs; "fault-stuck" stays ContainerCreating.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	proxy "k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type nodeStats struct {
	execs        atomic.Int64 // RunInContainer calls
	wsRequests   atomic.Int64 // WebSocket upgrades that reached this node (passed through by the apiserver)
	spdyRequests atomic.Int64 // SPDY upgrades from the apiserver (its translator, or kubectl over SPDY)
}

type nodeSpec struct {
	name      string
	port      int
	websocket bool
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func parseNode(s string) (nodeSpec, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return nodeSpec{}, fmt.Errorf("--node %q: want NAME:PORT[:websocket]", s)
	}
	port, err := strconv.Atoi(parts[1])
	if err != nil {
		return nodeSpec{}, fmt.Errorf("--node %q: %w", s, err)
	}
	ns := nodeSpec{name: parts[0], port: port}
	if len(parts) == 3 {
		if parts[2] != "websocket" {
			return nodeSpec{}, fmt.Errorf("--node %q: the only option is websocket", s)
		}
		ns.websocket = true
	}
	return ns, nil
}

// nodeState is the NodeProvider: the Node's status, and a way to flip its Ready condition.
type nodeState struct {
	mu   sync.Mutex
	node *v1.Node
	cb   func(*v1.Node)
}

func (n *nodeState) Ping(context.Context) error { return nil }

func (n *nodeState) NotifyNodeStatus(ctx context.Context, cb func(*v1.Node)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cb = cb
}

func (n *nodeState) setReady(ready bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range n.node.Status.Conditions {
		c := &n.node.Status.Conditions[i]
		if c.Type != v1.NodeReady {
			continue
		}
		c.LastTransitionTime, c.LastHeartbeatTime = metav1.Now(), metav1.Now()
		if ready {
			c.Status, c.Reason, c.Message = v1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"
		} else {
			c.Status, c.Reason, c.Message = v1.ConditionFalse, "KubeletNotReady", "container runtime is down (fault injected by the test)"
		}
	}
	if n.cb != nil {
		cp := n.node.DeepCopy()
		go n.cb(cp)
	}
}

func nodeObject(ns nodeSpec) v1.Node {
	res := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse("64"),
		v1.ResourceMemory: resource.MustParse("256Gi"),
		v1.ResourcePods:   resource.MustParse("2000"),
	}
	cond := func(t v1.NodeConditionType, s v1.ConditionStatus, reason, msg string) v1.NodeCondition {
		return v1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
	}
	n := v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: ns.name,
			Labels: map[string]string{
				"kubernetes.io/hostname": ns.name,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     runtime.GOARCH,
				"cwsandbox.test/node":    "true",
			},
		},
		Status: v1.NodeStatus{
			Capacity:        res,
			Allocatable:     res.DeepCopy(),
			Addresses:       []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}},
			DaemonEndpoints: v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: int32(ns.port)}},
			NodeInfo: v1.NodeSystemInfo{
				KubeletVersion:          "v1.37.2",
				OperatingSystem:         "linux",
				Architecture:            runtime.GOARCH,
				ContainerRuntimeVersion: "bwrap://0.1",
				OSImage:                 "cwsandbox test node",
			},
			Conditions: []v1.NodeCondition{
				cond(v1.NodeReady, v1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
				cond(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory", ""),
				cond(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure", ""),
				cond(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID", ""),
			},
		},
	}
	if ns.websocket {
		n.Status.DeclaredFeatures = []string{"ExtendWebSocketsToKubelet"}
	}
	return n
}

type runningNode struct {
	spec  nodeSpec
	state *nodeState
	prov  *provider
	stats *nodeStats
	node  *nodeutil.Node
}

// front is the node's TLS handler: it counts the transports, and (on a websocket node) turns
// a v5 WebSocket exec/attach into SPDY against the node's own streaming endpoint, as the
// 1.37 kubelet does with the CRI streaming server.
func front(n *runningNode, inner http.Handler, streamURL string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upgrade := strings.ToLower(r.Header.Get("Upgrade"))
		switch {
		case upgrade == "websocket":
			n.stats.wsRequests.Add(1)
		case strings.HasPrefix(upgrade, "spdy"):
			n.stats.spdyRequests.Add(1)
		}
		isStream := strings.HasPrefix(r.URL.Path, "/exec/") || strings.HasPrefix(r.URL.Path, "/attach/")
		if n.spec.websocket && isStream && wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
			loc, _ := url.Parse(streamURL + r.URL.Path + "?" + r.URL.RawQuery)
			q := r.URL.Query()
			opts := proxy.Options{Stdin: q.Get("input") == "1", Stdout: q.Get("output") == "1",
				Stderr: q.Get("error") == "1", Tty: q.Get("tty") == "1"}
			proxy.NewStreamTranslatorHandler(loc, nil, 0, opts).ServeHTTP(w, r)
			return
		}
		inner.ServeHTTP(w, r)
	})
}

func main() {
	var nodes multiFlag
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig the nodes use to reach the apiserver")
	flag.Var(&nodes, "node", "NAME:PORT[:websocket] of a node to run (repeatable)")
	tlsCert := flag.String("tls-cert", "", "serving certificate of the kubelet endpoints")
	tlsKey := flag.String("tls-key", "", "its key")
	clientCA := flag.String("client-ca", "", "CA that signs the apiserver's kubelet client certificate")
	control := flag.String("control", "127.0.0.1:0", "loopback address of the plain-HTTP fault endpoint")
	root := flag.String("root", "", "directory for pod state (volumes, logs)")
	bwrap := flag.String("bwrap", "", "bubblewrap binary")
	flag.Parse()
	if len(nodes) == 0 || *kubeconfig == "" || *tlsCert == "" || *tlsKey == "" || *root == "" || *bwrap == "" {
		fmt.Fprintln(os.Stderr, "cwsandbox-node: --node, --kubeconfig, --tls-cert, --tls-key, --root and --bwrap are required")
		os.Exit(2)
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cwsandbox-node: nsenter not found:", err)
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cwsandbox-node:", err)
		os.Exit(2)
	}
	cfg.QPS, cfg.Burst = 200, 400
	client := kubernetes.NewForConfigOrDie(cfg)

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	var running []*runningNode
	for _, s := range nodes {
		spec, err := parseNode(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cwsandbox-node:", err)
			os.Exit(2)
		}
		rn := &runningNode{spec: spec, stats: &nodeStats{}}
		rn.prov = &provider{nodeName: spec.name, root: *root, bwrap: *bwrap, nsenter: nsenter, stats: rn.stats, pods: map[string]*podRT{}}
		// The streaming endpoint the websocket translator dials: the same kubelet routes on loopback, plain HTTP.
		streamMux := http.NewServeMux()
		streamLn, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintln(os.Stderr, "cwsandbox-node:", err)
			os.Exit(1)
		}
		go func() { _ = (&http.Server{Handler: streamMux, ReadHeaderTimeout: 30 * time.Second}).Serve(streamLn) }()
		mux := http.NewServeMux()
		obj := nodeObject(spec)
		rn.state = &nodeState{}
		n, err := nodeutil.NewNode(spec.name,
			func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
				rn.state.node = pc.Node
				return rn.prov, rn.state, nil
			},
			nodeutil.WithClient(client),
			func(c *nodeutil.NodeConfig) error {
				c.NodeSpec = obj
				c.HTTPListenAddr = fmt.Sprintf("127.0.0.1:%d", spec.port)
				c.NumWorkers = 16
				c.InformerResyncPeriod = time.Minute
				c.StreamIdleTimeout = 4 * time.Hour
				c.StreamCreationTimeout = 30 * time.Second
				c.Handler = front(rn, mux, "http://"+streamLn.Addr().String())
				return nil
			},
			nodeutil.AttachProviderRoutes(mux),
			nodeutil.WithTLSConfig(nodeutil.WithKeyPairFromPath(*tlsCert, *tlsKey), withClientCA(*clientCA)),
		)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cwsandbox-node:", err)
			os.Exit(1)
		}
		api.AttachPodRoutes(api.PodHandlerConfig{
			RunInContainer:    rn.prov.RunInContainer,
			AttachToContainer: rn.prov.AttachToContainer,
			GetContainerLogs:  rn.prov.GetContainerLogs,
			StreamIdleTimeout: 4 * time.Hour, StreamCreationTimeout: 30 * time.Second,
		}, streamMux, false)
		rn.node = n
		running = append(running, rn)
	}
	errs := make(chan error, len(running))
	for _, rn := range running {
		go func() { errs <- rn.node.Run(ctx) }()
	}
	ready := make(chan struct{})
	go func() {
		for _, rn := range running {
			if err := rn.node.WaitReady(ctx, 0); err != nil {
				return
			}
		}
		close(ready)
	}()
	ln, err := net.Listen("tcp", *control)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cwsandbox-node:", err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: controlHandler(running, ready), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("control http://%s\n", ln.Addr())
	exit := 0
	select {
	case <-ctx.Done():
	case err := <-errs:
		fmt.Fprintln(os.Stderr, "cwsandbox-node: a node stopped:", err)
		exit = 1
	}
	cancel()
	_ = srv.Close()
	for _, rn := range running {
		rn.prov.stopAll()
	}
	os.Exit(exit)
}

func withClientCA(path string) func(*tls.Config) error {
	if path == "" {
		return func(*tls.Config) error { return nil }
	}
	return nodeutil.WithCAFromPath(path)
}

func controlHandler(nodes []*runningNode, ready <-chan struct{}) http.Handler {
	mux := http.NewServeMux()
	findPod := func(ns, name string) (*runningNode, *podRT) {
		for _, rn := range nodes {
			rn.prov.mu.Lock()
			rt := rn.prov.pods[key(ns, name)]
			rn.prov.mu.Unlock()
			if rt != nil {
				return rn, rt
			}
		}
		return nil, nil
	}
	writeJSON := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
			writeJSON(w, 200, map[string]any{"ready": true})
		default:
			writeJSON(w, 503, map[string]any{"ready": false})
		}
	})
	mux.HandleFunc("POST /pods/{ns}/{name}/{fault}", func(w http.ResponseWriter, r *http.Request) {
		rn, rt := findPod(r.PathValue("ns"), r.PathValue("name"))
		if rt == nil {
			writeJSON(w, 404, map[string]any{"error": "no such pod on any node"})
			return
		}
		var ok bool
		switch r.PathValue("fault") {
		case "evict":
			ok = rn.prov.evict(rt)
		case "oom":
			ok = rn.prov.oomKill(rt)
		case "kill":
			ok = rn.prov.kill(rt)
		default:
			writeJSON(w, 400, map[string]any{"error": "fault is one of evict, oom, kill"})
			return
		}
		if !ok {
			writeJSON(w, 409, map[string]any{"error": "the pod is not running"})
			return
		}
		writeJSON(w, 200, map[string]any{"node": rn.spec.name})
	})
	mux.HandleFunc("GET /pods/{ns}/{name}/processes", func(w http.ResponseWriter, r *http.Request) {
		rn, rt := findPod(r.PathValue("ns"), r.PathValue("name"))
		if rt == nil {
			writeJSON(w, 404, map[string]any{"error": "no such pod on any node"})
			return
		}
		rn.prov.mu.Lock()
		ctrs := rt.ctrs
		rn.prov.mu.Unlock()
		out := map[string]any{}
		for name, s := range ctrs {
			out[name] = s.processes()
		}
		writeJSON(w, 200, out)
	})
	mux.HandleFunc("POST /nodes/{name}/ready", func(w http.ResponseWriter, r *http.Request) {
		for _, rn := range nodes {
			if rn.spec.name == r.PathValue("name") {
				rn.state.setReady(r.URL.Query().Get("value") != "false")
				writeJSON(w, 200, map[string]any{"node": rn.spec.name})
				return
			}
		}
		writeJSON(w, 404, map[string]any{"error": "no such node"})
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		out := map[string]any{}
		for _, rn := range nodes {
			rn.prov.mu.Lock()
			pods := len(rn.prov.pods)
			rn.prov.mu.Unlock()
			out[rn.spec.name] = map[string]any{
				"websocket_declared": rn.spec.websocket,
				"execs":              rn.stats.execs.Load(),
				"websocket_requests": rn.stats.wsRequests.Load(),
				"spdy_requests":      rn.stats.spdyRequests.Load(),
				"pods":               pods,
			}
		}
		writeJSON(w, 200, out)
	})
	return mux
}
