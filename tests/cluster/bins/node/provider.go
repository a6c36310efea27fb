package main

// The pod lifecycle a kubelet gives, on sandboxes: Pending (ContainerCreating) -> Running ->
// Succeeded/Failed with the containers' real exit codes; activeDeadlineSeconds (Failed,
// DeadlineExceeded); graceful deletion (SIGTERM to PID 1, SIGKILL after the grace period);
// and the faults a test asks for (eviction, OOM kill, container kill, image pull failure).
// restartPolicy is treated as Never: a container that exits is reported terminated, never
// restarted. Resource limits are not enforced (no cgroups): OOMKilled comes only from a fault.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	utilexec "k8s.io/utils/exec"
)

var faultRE = regexp.MustCompile(`fault-([a-z]+)(?::([0-9.]+))?`)

type podRT struct {
	pod      *v1.Pod // the pod as this node last reported it (spec from the API, status ours)
	dir      string
	ctrs     map[string]*sandbox
	deadline *time.Timer
	failing  bool // a fault or deadline is ending the pod: container exits are not reported separately
	deleting bool
}

type provider struct {
	nodeName string
	root     string
	bwrap    string
	nsenter  string
	stats    *nodeStats

	mu     sync.Mutex
	pods   map[string]*podRT
	notify func(*v1.Pod)

	// The status copies published, delivered to notify in the order they were made (one goroutine):
	// a goroutine per copy let a pod's Running overtake its Failed and stay Running forever.
	outMu  sync.Mutex
	outbox []*v1.Pod
	outCnd *sync.Cond
}

func key(ns, name string) string { return ns + "/" + name }

func now() metav1.Time { return metav1.NewTime(time.Now().Truncate(time.Second)) }

func cond(t v1.PodConditionType, ok bool, reason, msg string) v1.PodCondition {
	s := v1.ConditionFalse
	if ok {
		s = v1.ConditionTrue
	}
	return v1.PodCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: now()}
}

// publish queues a copy of the pod for the pod controller, in order. Call with p.mu held.
func (p *provider) publish(rt *podRT) {
	if p.notify == nil {
		return
	}
	cp := rt.pod.DeepCopy()
	p.outMu.Lock()
	p.outbox = append(p.outbox, cp)
	p.outMu.Unlock()
	p.outCnd.Signal()
}

// deliver hands the queued copies to cb one at a time, oldest first, until ctx ends.
func (p *provider) deliver(ctx context.Context, cb func(*v1.Pod)) {
	go func() {
		<-ctx.Done()
		p.outMu.Lock()
		p.outMu.Unlock()
		p.outCnd.Broadcast()
	}()
	for {
		p.outMu.Lock()
		for len(p.outbox) == 0 && ctx.Err() == nil {
			p.outCnd.Wait()
		}
		if ctx.Err() != nil {
			p.outMu.Unlock()
			return
		}
		next := p.outbox[0]
		p.outbox[0] = nil
		p.outbox = p.outbox[1:]
		p.outMu.Unlock()
		cb(next)
	}
}

func (p *provider) containerStatuses(rt *podRT, state func(c v1.Container) (v1.ContainerState, bool)) []v1.ContainerStatus {
	var out []v1.ContainerStatus
	for _, c := range rt.pod.Spec.Containers {
		st, ready := state(c)
		started := st.Running != nil
		out = append(out, v1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "", State: st, Ready: ready,
			Started: &started, ContainerID: "bwrap://" + string(rt.pod.UID) + "/" + c.Name})
	}
	return out
}

func (p *provider) CreatePod(ctx context.Context, pod *v1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := key(pod.Namespace, pod.Name)
	if _, ok := p.pods[k]; ok {
		return nil
	}
	dir := filepath.Join(p.root, p.nodeName, pod.Namespace, pod.Name+"-"+string(pod.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	rt := &podRT{pod: pod.DeepCopy(), dir: dir, ctrs: map[string]*sandbox{}}
	p.pods[k] = rt
	start := now()
	rt.pod.Status = v1.PodStatus{
		Phase:     v1.PodPending,
		HostIP:    "127.0.0.1",
		HostIPs:   []v1.HostIP{{IP: "127.0.0.1"}},
		StartTime: &start,
		QOSClass:  pod.Status.QOSClass,
		Conditions: []v1.PodCondition{
			cond(v1.PodReadyToStartContainers, false, "", ""),
			cond(v1.PodInitialized, true, "", ""),
			cond(v1.PodReady, false, "ContainersNotReady", "containers with unready status"),
			cond(v1.ContainersReady, false, "ContainersNotReady", "containers with unready status"),
			cond(v1.PodScheduled, true, "", ""),
		},
	}
	rt.pod.Status.ContainerStatuses = p.containerStatuses(rt, func(v1.Container) (v1.ContainerState, bool) {
		return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}, false
	})
	p.armDeadline(rt)
	p.publish(rt)
	go p.run(rt)
	return nil
}

func (p *provider) armDeadline(rt *podRT) {
	if rt.deadline != nil {
		rt.deadline.Stop()
		rt.deadline = nil
	}
	ads := rt.pod.Spec.ActiveDeadlineSeconds
	if ads == nil || rt.pod.Status.StartTime == nil {
		return
	}
	left := time.Until(rt.pod.Status.StartTime.Add(time.Duration(*ads) * time.Second))
	rt.deadline = time.AfterFunc(max(left, 0), func() {
		p.fail(rt, "DeadlineExceeded", "Pod was active on the node longer than the specified deadline", "Error", 137, false)
	})
}

func (p *provider) alive(rt *podRT) bool {
	return p.pods[key(rt.pod.Namespace, rt.pod.Name)] == rt && !rt.deleting && !rt.failing
}

// run starts the pod's containers (or plays the fault its image names) and reports Running.
func (p *provider) run(rt *podRT) {
	image := rt.pod.Spec.Containers[0].Image
	fault, arg := "", 0.2
	if m := faultRE.FindStringSubmatch(image); m != nil {
		fault = m[1]
		if m[2] != "" {
			arg, _ = strconv.ParseFloat(m[2], 64)
		}
	}
	if len(image) >= 17 && image[:17] == "registry.invalid/" {
		fault = "imagepull"
	}
	switch fault {
	case "stuck":
		return
	case "imagepull":
		time.Sleep(200 * time.Millisecond)
		p.mu.Lock()
		if p.alive(rt) {
			msg := fmt.Sprintf("Failed to pull image %q: rpc error: code = NotFound desc = failed to resolve reference %q: not found", image, image)
			p.setWaiting(rt, "ErrImagePull", msg)
		}
		p.mu.Unlock()
		time.Sleep(time.Second)
		p.mu.Lock()
		if p.alive(rt) {
			p.setWaiting(rt, "ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", image))
		}
		p.mu.Unlock()
		return
	}
	started := map[string]*sandbox{}
	for i := range rt.pod.Spec.Containers {
		c := &rt.pod.Spec.Containers[i]
		s, err := startSandbox(p.bwrap, rt.dir, rt.pod, c)
		if err != nil {
			for _, s := range started {
				s.kill()
			}
			p.mu.Lock()
			if p.alive(rt) {
				p.setWaiting(rt, "RunContainerError", err.Error())
			}
			p.mu.Unlock()
			return
		}
		started[c.Name] = s
	}
	p.mu.Lock()
	if !p.alive(rt) {
		p.mu.Unlock()
		for _, s := range started {
			s.kill()
		}
		return
	}
	rt.ctrs = started
	st := &rt.pod.Status
	st.Phase = v1.PodRunning
	st.PodIP = "127.0.0.1"
	st.PodIPs = []v1.PodIP{{IP: "127.0.0.1"}}
	st.Conditions = []v1.PodCondition{
		cond(v1.PodReadyToStartContainers, true, "", ""),
		cond(v1.PodInitialized, true, "", ""),
		cond(v1.PodReady, true, "", ""),
		cond(v1.ContainersReady, true, "", ""),
		cond(v1.PodScheduled, true, "", ""),
	}
	st.ContainerStatuses = p.containerStatuses(rt, func(c v1.Container) (v1.ContainerState, bool) {
		return v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.NewTime(started[c.Name].started)}}, true
	})
	p.publish(rt)
	p.mu.Unlock()
	for name, s := range started {
		go p.watch(rt, name, s)
	}
	switch fault {
	case "evict", "oom", "oomkilled":
		time.Sleep(time.Duration(arg * float64(time.Second)))
		if fault == "evict" {
			p.evict(rt)
		} else {
			p.oomKill(rt)
		}
	}
}

func (p *provider) setWaiting(rt *podRT, reason, msg string) {
	rt.pod.Status.ContainerStatuses = p.containerStatuses(rt, func(v1.Container) (v1.ContainerState, bool) {
		return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason, Message: msg}}, false
	})
	p.publish(rt)
}

func terminated(s *sandbox, code int, reason string) v1.ContainerState {
	t := &v1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, FinishedAt: now(),
		ContainerID: ""}
	if s != nil {
		t.StartedAt = metav1.NewTime(s.started)
	}
	return v1.ContainerState{Terminated: t}
}

// watch reports a container that exits on its own (its command returned or was killed).
func (p *provider) watch(rt *podRT, name string, s *sandbox) {
	<-s.exited
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.alive(rt) {
		return
	}
	code := s.code()
	for i := range rt.pod.Status.ContainerStatuses {
		cs := &rt.pod.Status.ContainerStatuses[i]
		if cs.Name == name {
			reason := "Completed"
			if code != 0 {
				reason = "Error"
			}
			cs.State = terminated(s, code, reason)
			cs.Ready = false
			f := false
			cs.Started = &f
		}
	}
	allDone, allZero := true, true
	for _, cs := range rt.pod.Status.ContainerStatuses {
		if cs.State.Terminated == nil {
			allDone = false
		} else if cs.State.Terminated.ExitCode != 0 {
			allZero = false
		}
	}
	rt.pod.Status.Conditions = []v1.PodCondition{
		cond(v1.PodReadyToStartContainers, !allDone, "", ""),
		cond(v1.PodInitialized, true, "", ""),
		cond(v1.PodReady, false, "PodCompleted", ""),
		cond(v1.ContainersReady, false, "PodCompleted", ""),
		cond(v1.PodScheduled, true, "", ""),
	}
	if allDone {
		rt.pod.Status.Phase = v1.PodSucceeded
		if !allZero {
			rt.pod.Status.Phase = v1.PodFailed
			rt.pod.Status.Conditions[2].Reason, rt.pod.Status.Conditions[3].Reason = "PodFailed", "PodFailed"
		}
		if rt.deadline != nil {
			rt.deadline.Stop()
		}
	}
	p.publish(rt)
}

// fail ends a running (or pending) pod the way the kubelet does: every container is killed,
// the containers are reported terminated with containerReason/exitCode, the pod Failed.
func (p *provider) fail(rt *podRT, reason, message, containerReason string, exitCode int, disruption bool) bool {
	p.mu.Lock()
	if !p.alive(rt) || rt.pod.Status.Phase == v1.PodSucceeded || rt.pod.Status.Phase == v1.PodFailed {
		p.mu.Unlock()
		return false
	}
	rt.failing = true
	ctrs := rt.ctrs
	p.mu.Unlock()
	for _, s := range ctrs {
		s.kill()
	}
	for _, s := range ctrs {
		<-s.exited
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pods[key(rt.pod.Namespace, rt.pod.Name)] != rt || rt.deleting {
		return true
	}
	rt.pod.Status.ContainerStatuses = p.containerStatuses(rt, func(c v1.Container) (v1.ContainerState, bool) {
		return terminated(ctrs[c.Name], exitCode, containerReason), false
	})
	rt.pod.Status.Phase = v1.PodFailed
	rt.pod.Status.Reason = reason
	rt.pod.Status.Message = message
	conds := []v1.PodCondition{
		cond(v1.PodReadyToStartContainers, false, "", ""),
		cond(v1.PodInitialized, true, "", ""),
		cond(v1.PodReady, false, "PodFailed", ""),
		cond(v1.ContainersReady, false, "PodFailed", ""),
		cond(v1.PodScheduled, true, "", ""),
	}
	if disruption {
		conds = append(conds, cond(v1.DisruptionTarget, true, "TerminationByKubelet", message))
	}
	rt.pod.Status.Conditions = conds
	if rt.deadline != nil {
		rt.deadline.Stop()
	}
	p.publish(rt)
	return true
}

func (p *provider) evict(rt *podRT) bool {
	return p.fail(rt, "Evicted", "The node was low on resource: memory. Threshold quantity: 100Mi, available: 12Mi.",
		"ContainerStatusUnknown", 137, true)
}

func (p *provider) oomKill(rt *podRT) bool {
	return p.fail(rt, "", "", "OOMKilled", 137, false)
}

// kill SIGKILLs the pod's containers; their exits are then reported as they are (137, Error).
func (p *provider) kill(rt *podRT) bool {
	p.mu.Lock()
	ctrs := rt.ctrs
	ok := p.alive(rt) && len(ctrs) > 0
	p.mu.Unlock()
	for _, s := range ctrs {
		s.kill()
	}
	return ok
}

func (p *provider) UpdatePod(ctx context.Context, pod *v1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	rt, ok := p.pods[key(pod.Namespace, pod.Name)]
	if !ok {
		return nil
	}
	rt.pod.Spec.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	rt.pod.Labels, rt.pod.Annotations = pod.Labels, pod.Annotations
	if rt.pod.Status.Phase == v1.PodPending || rt.pod.Status.Phase == v1.PodRunning {
		p.armDeadline(rt)
	}
	return nil
}

// DeletePod stops the pod's containers: SIGTERM to each PID 1, SIGKILL after the grace period,
// then reports them terminated so the pod controller removes the object. Returns at once.
func (p *provider) DeletePod(ctx context.Context, pod *v1.Pod) error {
	p.mu.Lock()
	k := key(pod.Namespace, pod.Name)
	rt, ok := p.pods[k]
	if !ok {
		p.mu.Unlock()
		return errdefs.NotFound("pod not found")
	}
	if rt.deleting {
		p.mu.Unlock()
		return nil
	}
	rt.deleting = true
	if rt.deadline != nil {
		rt.deadline.Stop()
	}
	ctrs := rt.ctrs
	p.mu.Unlock()
	grace := int64(30)
	if pod.DeletionGracePeriodSeconds != nil {
		grace = *pod.DeletionGracePeriodSeconds
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	go func() {
		for _, s := range ctrs {
			s.signal(15)
		}
		timeout := time.After(time.Duration(grace) * time.Second)
		for _, s := range ctrs {
			select {
			case <-s.exited:
			case <-timeout:
			}
		}
		for _, s := range ctrs {
			s.kill()
			<-s.exited
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		st := &rt.pod.Status
		if st.Phase != v1.PodFailed && st.Phase != v1.PodSucceeded {
			allZero := true
			st.ContainerStatuses = p.containerStatuses(rt, func(c v1.Container) (v1.ContainerState, bool) {
				s := ctrs[c.Name]
				if s == nil {
					return terminated(nil, 137, "ContainerStatusUnknown"), false
				}
				code := s.code()
				reason := "Completed"
				if code != 0 {
					reason, allZero = "Error", false
				}
				return terminated(s, code, reason), false
			})
			st.Phase = v1.PodSucceeded
			if !allZero {
				st.Phase = v1.PodFailed
			}
		}
		ts := now()
		rt.pod.DeletionTimestamp = &ts
		rt.pod.DeletionGracePeriodSeconds = pod.DeletionGracePeriodSeconds
		p.publish(rt)
		delete(p.pods, k)
		_ = os.RemoveAll(rt.dir)
	}()
	return nil
}

func (p *provider) GetPod(ctx context.Context, ns, name string) (*v1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rt, ok := p.pods[key(ns, name)]
	if !ok {
		return nil, errdefs.NotFound("pod not found")
	}
	return rt.pod.DeepCopy(), nil
}

func (p *provider) GetPodStatus(ctx context.Context, ns, name string) (*v1.PodStatus, error) {
	pod, err := p.GetPod(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *provider) GetPods(ctx context.Context) ([]*v1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*v1.Pod, 0, len(p.pods))
	for _, rt := range p.pods {
		out = append(out, rt.pod.DeepCopy())
	}
	return out, nil
}

func (p *provider) NotifyPods(ctx context.Context, cb func(*v1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.outCnd = sync.NewCond(&p.outMu)
	p.notify = cb
	go p.deliver(ctx, cb)
}

func (p *provider) lookup(ns, name, container string) (*podRT, *sandbox, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rt, ok := p.pods[key(ns, name)]
	if !ok {
		return nil, nil, errdefs.NotFound(fmt.Sprintf("pod %s/%s not found on this node", ns, name))
	}
	if container == "" && len(rt.pod.Spec.Containers) > 0 {
		container = rt.pod.Spec.Containers[0].Name
	}
	s := rt.ctrs[container]
	return rt, s, nil
}

func (p *provider) RunInContainer(ctx context.Context, ns, name, container string, cmd []string, attach api.AttachIO) error {
	_, s, err := p.lookup(ns, name, container)
	if err != nil {
		return err
	}
	if s == nil || !s.running() {
		return fmt.Errorf("container %q is not running", container)
	}
	p.stats.execs.Add(1)
	var stdout, stderr io.Writer
	if w := attach.Stdout(); w != nil {
		stdout = w
		defer w.Close()
	}
	if w := attach.Stderr(); w != nil {
		stderr = w
		defer w.Close()
	} else if stdout == nil {
		stderr = io.Discard
	}
	if stdout == nil {
		stdout = io.Discard
	}
	code, err := s.execIn(p.nsenter, cmd, attach.Stdin(), stdout, stderr)
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with non-zero exit code: %d", code), Code: code}
	}
	return nil
}

func (p *provider) AttachToContainer(ctx context.Context, ns, name, container string, attach api.AttachIO) error {
	_, s, err := p.lookup(ns, name, container)
	if err != nil {
		return err
	}
	if s == nil || !s.running() {
		return fmt.Errorf("container %q is not running", container)
	}
	if in := attach.Stdin(); in != nil && s.stdin != nil {
		go func() { _, _ = io.Copy(s.stdin, in) }()
	}
	if out := attach.Stdout(); out != nil {
		f, err := os.Open(s.logPath)
		if err != nil {
			return err
		}
		defer f.Close()
		_, _ = f.Seek(0, io.SeekEnd)
		_ = follow(ctx, f, out, s.exited)
	} else {
		select {
		case <-s.exited:
		case <-ctx.Done():
		}
	}
	return nil
}

// follow copies f to w until done closes (then drains what is left) or ctx ends.
func follow(ctx context.Context, f *os.File, w io.Writer, done <-chan struct{}) error {
	buf := make([]byte, 32*1024)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		select {
		case <-done:
			_, err := io.Copy(w, f)
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

func (p *provider) GetContainerLogs(ctx context.Context, ns, name, container string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	rt, s, err := p.lookup(ns, name, container)
	if err != nil {
		return nil, err
	}
	if container == "" {
		container = rt.pod.Spec.Containers[0].Name
	}
	path := filepath.Join(rt.dir, container+".log")
	if s != nil {
		path = s.logPath
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, errdefs.NotFound(fmt.Sprintf("no logs for container %q (it never started)", container))
	}
	if opts.Tail > 0 {
		b, _ := io.ReadAll(f)
		lines, i := 0, len(b)
		if i > 0 && b[i-1] == '\n' {
			i--
		}
		for ; i > 0; i-- {
			if b[i-1] == '\n' {
				lines++
				if lines == opts.Tail {
					break
				}
			}
		}
		_, _ = f.Seek(int64(i), io.SeekStart)
	}
	if !opts.Follow || s == nil {
		return f, nil
	}
	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(follow(ctx, f, pw, s.exited))
		f.Close()
	}()
	return readCloser{Reader: pr, close: func() error { return pr.Close() }}, nil
}

func (p *provider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return nil, errdefs.NotFound("stats are not served by this node")
}

func (p *provider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, errdefs.NotFound("metrics are not served by this node")
}

func (p *provider) PortForward(ctx context.Context, ns, pod string, port int32, stream io.ReadWriteCloser) error {
	return errdefs.NotFound("port-forward is not supported by this node")
}

// stopAll kills every container of every pod (the node is shutting down).
func (p *provider) stopAll() {
	p.mu.Lock()
	var all []*sandbox
	for _, rt := range p.pods {
		rt.deleting = true
		for _, s := range rt.ctrs {
			all = append(all, s)
		}
	}
	p.mu.Unlock()
	for _, s := range all {
		s.kill()
	}
	for _, s := range all {
		<-s.exited
	}
}
