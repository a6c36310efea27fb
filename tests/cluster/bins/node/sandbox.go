package main

// One container of a pod: its command as PID 1 of a bubblewrap sandbox (new user, PID and
// mount namespaces; the host's /usr and /etc read-only, a fresh /dev and /proc, the pod's
// emptyDir volumes at their mountPaths). The image name is not pulled: every image maps to
// this read-only view of the host, as the Python test server's container does. Execs join
// the sandbox with nsenter, so they share PID 1's namespaces, root, cwd and user; when PID 1
// dies the kernel kills every process in the PID namespace, as in a real container.
//
// THIS IS NOT AN ISOLATION BOUNDARY: it runs trusted test commands.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
)

var baseEnv = map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/"}

type sandbox struct {
	name    string
	cmd     *exec.Cmd
	pid1    int
	pidns   string
	logPath string
	env     []string
	stdin   io.WriteCloser // PID 1's stdin when the container asks for one (attach)
	started time.Time

	exited   chan struct{}
	mu       sync.Mutex
	exitCode int
}

func containerEnv(pod *v1.Pod, c *v1.Container) []string {
	env := map[string]string{}
	for k, v := range baseEnv {
		env[k] = v
	}
	env["HOSTNAME"] = pod.Name
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

func ids(pod *v1.Pod, c *v1.Container) (int64, int64) {
	var uid, gid int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		if psc.RunAsUser != nil {
			uid = *psc.RunAsUser
		}
		if psc.RunAsGroup != nil {
			gid = *psc.RunAsGroup
		}
	}
	if csc := c.SecurityContext; csc != nil {
		if csc.RunAsUser != nil {
			uid = *csc.RunAsUser
		}
		if csc.RunAsGroup != nil {
			gid = *csc.RunAsGroup
		}
	}
	return uid, gid
}

// startSandbox starts the container and returns once its PID 1 runs the container's command.
func startSandbox(bwrap, podDir string, pod *v1.Pod, c *v1.Container) (*sandbox, error) {
	uid, gid := ids(pod, c)
	args := []string{"--unshare-pid", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1",
		"--info-fd", "3", "--uid", strconv.FormatInt(uid, 10), "--gid", strconv.FormatInt(gid, 10),
		"--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc", "--dev", "/dev", "--proc", "/proc"}
	for _, l := range [][2]string{{"/bin", "usr/bin"}, {"/sbin", "usr/sbin"}, {"/lib", "usr/lib"}, {"/lib64", "usr/lib64"}} {
		args = append(args, "--symlink", l[1], l[0])
	}
	emptyDirs := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		}
	}
	for _, m := range c.VolumeMounts {
		if emptyDirs[m.Name] {
			src := filepath.Join(podDir, "volumes", m.Name)
			if err := os.MkdirAll(src, 0o777); err != nil {
				return nil, err
			}
			flag := "--bind"
			if m.ReadOnly {
				flag = "--ro-bind"
			}
			args = append(args, flag, src, m.MountPath)
		}
	}
	wd := c.WorkingDir
	if wd == "" {
		wd = "/"
	}
	env := containerEnv(pod, c)
	args = append(args, "--chdir", wd, "--clearenv")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		args = append(args, "--setenv", k, v)
	}
	command := append(append([]string{}, c.Command...), c.Args...)
	if len(c.Command) == 0 {
		command = append([]string{"/bin/sh"}, c.Args...)
	}
	args = append(append(args, "--"), command...)

	logPath := filepath.Join(podDir, c.Name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	infoR, infoW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer infoR.Close()
	cmd := exec.Command(bwrap, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = []*os.File{infoW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	s := &sandbox{name: c.Name, cmd: cmd, logPath: logPath, env: env, exited: make(chan struct{}), exitCode: -1}
	if c.Stdin {
		w, err := cmd.StdinPipe()
		if err != nil {
			infoW.Close()
			return nil, err
		}
		s.stdin = w
	}
	if err := cmd.Start(); err != nil {
		infoW.Close()
		return nil, fmt.Errorf("starting bwrap: %w", err)
	}
	infoW.Close()
	go s.reap()
	var info struct {
		ChildPid int `json:"child-pid"`
	}
	if err := json.NewDecoder(infoR).Decode(&info); err != nil || info.ChildPid == 0 {
		s.kill()
		<-s.exited
		return nil, fmt.Errorf("bwrap did not start the container (%v); its output: %s", err, tail(logPath, 2048))
	}
	s.pid1 = info.ChildPid
	want := strings.Join(command, "\x00")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", s.pid1))
		if err == nil && strings.TrimRight(string(b), "\x00") == want {
			s.pidns, _ = os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", s.pid1))
			s.started = time.Now()
			return s, nil
		}
		select {
		case <-s.exited: // it ran and is already done (`true`): a container that started and exited
			s.started = time.Now()
			return s, nil
		case <-time.After(5 * time.Millisecond):
		}
	}
	s.kill()
	<-s.exited
	return nil, errors.New("the container did not start within 10s")
}

func tail(path string, n int64) string {
	b, _ := os.ReadFile(path)
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}

// exitStatus maps a finished process to a container exit code: signals as 128+N.
func exitStatus(err error, state *os.ProcessState) int {
	if state == nil {
		if err != nil {
			return 128
		}
		return 0
	}
	if ws, ok := state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return state.ExitCode()
}

func (s *sandbox) reap() {
	err := s.cmd.Wait()
	s.mu.Lock()
	s.exitCode = exitStatus(err, s.cmd.ProcessState)
	s.mu.Unlock()
	close(s.exited)
}

func (s *sandbox) code() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitCode
}

func (s *sandbox) running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// signal sends sig to PID 1. A PID namespace's init ignores signals it has no handler for,
// except SIGKILL, exactly as in a real container (so `sleep` as PID 1 outlives SIGTERM).
func (s *sandbox) signal(sig syscall.Signal) {
	if s.pid1 != 0 && s.running() {
		_ = syscall.Kill(s.pid1, sig)
	}
}

// kill SIGKILLs PID 1 (the kernel then kills the whole PID namespace) and bwrap's group.
func (s *sandbox) kill() {
	s.signal(syscall.SIGKILL)
	if s.cmd.Process != nil && s.running() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// processes lists the host pids and command lines in the container, PID 1 excluded, zombies excluded.
func (s *sandbox) processes() []map[string]any {
	out := []map[string]any{}
	if s.pidns == "" || !s.running() {
		return out
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == s.pid1 {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		if err != nil || ns != s.pidns {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 0 && fields[0] == "Z" {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		out = append(out, map[string]any{"pid": pid, "cmdline": strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))})
	}
	return out
}

// discardOnError copies into w until a write fails, then keeps reading into nothing, so a
// process whose client went away is never blocked on a full pipe (and never killed for it).
type discardOnError struct {
	mu  sync.Mutex
	w   io.Writer
	bad bool
}

func (d *discardOnError) Write(p []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.w != nil && !d.bad {
		if _, err := d.w.Write(p); err != nil {
			d.bad = true
		}
	}
	return len(p), nil
}

// execIn runs argv inside the container and returns its exit code (signals as 128+N). Like a
// kubelet with containerd, it returns once the process has exited and its output pipes are
// closed; the caller going away (a closed connection, a cancelled context) neither kills the
// process nor blocks it: stdin is closed and its output is drained.
func (s *sandbox) execIn(nsenter string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if !s.running() {
		return 0, errors.New("container not running")
	}
	args := []string{"-t", strconv.Itoa(s.pid1), "-U", "-m", "-p", "--preserve-credentials", "-r", "-w", "--", "/usr/bin/env", "-i"}
	args = append(append(args, s.env...), argv...)
	cmd := exec.Command(nsenter, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	outW := &discardOnError{w: stdout}
	errW := &discardOnError{w: stderr}
	if stderr == nil {
		errW = outW
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	var in io.WriteCloser
	if stdin != nil {
		w, err := cmd.StdinPipe()
		if err != nil {
			return 0, err
		}
		in = w
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	if in != nil {
		go func() {
			_, _ = io.Copy(in, stdin)
			in.Close()
		}()
	}
	err := cmd.Wait()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return 0, err
	}
	return exitStatus(err, cmd.ProcessState), nil
}
