//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

var (
	binDir     = flag.String("bin", "", "directory with criserver and shim-runc")
	resultsDir = flag.String("results", "results", "directory the JSON report is written to")
	cycles     = flag.Int("cycles", 50, "sequential pod cycles timed per runtime")
	churnFor   = flag.Duration("churn", 60*time.Second, "how long the 10-client churn runs per runtime")
	only       = flag.String("only", "", "run one runtime only (crisp or containerd; without the pull part then), or only the NRI comparison (nri), the tracing comparison (tracing), the WebAssembly comparison (wasm) or the pull benchmark (pull)")
	hold       = flag.Duration("hold", 0, "keep the 20 memory pods this long after measuring them (to profile them by hand)")
	metricsOn  = flag.Bool("crisp-metrics", true, "serve crisp's Prometheus metrics on a loopback port, for the pod start breakdown (-crisp-metrics=false measures crisp without)")
	base       = flag.Bool("base", true, "run the base measurements: sequential cycles, churn, 20 pods' memory, exec, lists at 100 pods (-base=false for quick density or soak runs)")
	density    = flag.Int("density", 30, "pods of the density run (0: none)")
	idleFor    = flag.Duration("idle", 60*time.Second, "the window idle CPU is measured over at density")
	listCalls  = flag.Int("list-calls", 200, "timed calls of each list RPC at density")
	soak       = flag.Bool("soak", false, "run the soak: -soak-execs ExecSyncs into one container, -soak-cycles pod cycles")
	soakExecs  = flag.Int("soak-execs", 1000, "ExecSync calls of the soak (shim memory after the first vs after the last)")
	soakFirst  = flag.Int("soak-first", 100, "pod cycles after which the soak reads the daemon's memory first")
	soakCycles = flag.Int("soak-cycles", 1000, "pod cycles of the soak (daemon memory after -soak-first vs after these)")
	taskShim   = flag.String("task-shim", "/var/cache/crisp/containerd-v2.4.2/bin", "directory with containerd-shim-runc-v2 and runc: crisp runs -cycles pods on it as a task-only runtime handler, interleaved with its own shim's (empty: skip)")
	nriCost    = flag.Bool("nri", true, "compare crisp with NRI disabled, enabled with no plugin and enabled with one no-op plugin: three crisps, -cycles pod cycles each, interleaved (~25 s at 50)")
	tracingOn  = flag.Bool("tracing", true, "compare crisp with tracing off and on (every call traced, exported to an OTLP receiver in the bench), and with -base-bin's crisp: -cycles pod cycles each, interleaved, then 10 pods each for the shims' memory (~50 s at 50)")
	baseBin    = flag.String("base-bin", "", "directory with criserver and shim-runc built before tracing (commit fb5f5ee), the tracing comparison's base (empty: no base)")
	instance   = flag.Int("instance", 0, "0-7: runs with different instances use their own root, lock, bridges, subnets and cgroup parents, so they can run at once")
)

// clients is how many CRI clients run pods concurrently, as kubelet's pod workers do.
const clients = 10

// benchRoot holds every runtime's files of an instance; short, because shim socket
// paths grow under it.
func benchRoot(instance int) string {
	if instance == 0 {
		return "/run/crisp-bench"
	}
	return fmt.Sprintf("/run/crisp-bench%d", instance)
}

// subnet is the pod subnet of an instance's runtime i (0 containerd, 1 crisp): the
// first instance's are 10.233 and 10.234, the others' from 10.240 up, above the
// 10.200-10.239 /24s the e2e tests pick from.
func subnet(instance, i int) string {
	if instance == 0 {
		return fmt.Sprintf("10.%d.0.0/16", 233+i)
	}
	return fmt.Sprintf("10.%d.0.0/16", 238+2*instance+i)
}

func TestBench(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("make bench needs root")
	}
	if *binDir == "" {
		t.Fatal("-bin is required")
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	if *instance < 0 || *instance > 7 {
		t.Fatal("-instance must be 0-7")
	}
	switch *only {
	case "", "crisp", "containerd", "nri", "tracing", "wasm", "pull":
	default:
		t.Fatalf("-only %q: want crisp, containerd, nri, tracing, wasm or pull", *only)
	}
	runNRI := (*nriCost && (*only == "" || *only == "crisp")) || *only == "nri"
	runTracing := (*tracingOn && (*only == "" || *only == "crisp")) || *only == "tracing"
	runWasm := (*wasmOn && (*only == "" || *only == "crisp")) || *only == "wasm"
	benchRoot := benchRoot(*instance)
	// One run of an instance at a time: its runs share benchRoot, the bridges, the
	// subnets and the cgroup parents, and each removes what it finds there.
	lock, err := os.OpenFile(benchRoot+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Logf("another benchmark runs (it holds %s); waiting for it", lock.Name())
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
	}

	if err := os.RemoveAll(benchRoot); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(benchRoot, 0o711); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(benchRoot)

	host := imagetest.StartRegistry(t)
	busybox := host + "/busybox:bench"
	imagetest.Push(t, host, "busybox:bench", imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip))
	pause := host + "/pause:bench"
	imagetest.Push(t, host, "pause:bench", imagetest.PauseImage(t))
	// Three distinct ~50 MB images of 5 random (incompressible) layers per runtime, so
	// every timed pull is a first pull (pushed only for a run that pulls them: the NRI
	// comparison alone does not).
	var big []string
	for i := range 6 {
		big = append(big, fmt.Sprintf("%s/big%d:bench", host, i))
		if *only != "nri" && *only != "tracing" && *only != "wasm" && *only != "pull" {
			imagetest.Push(t, host, fmt.Sprintf("big%d:bench", i), bigImage(t, uint64(i)))
		}
	}

	rep := &Report{Time: time.Now(), Runtimes: map[string]Results{}, Versions: map[string]string{}}
	rep.Host, _ = os.Hostname()

	runs := []struct {
		name   string
		start  func(context.Context, Spec) (*Daemon, error)
		bridge string
		subnet string
		pulls  []string
	}{
		{"containerd", StartContainerd, fmt.Sprintf("benchctrd%d", *instance), subnet(*instance, 0), big[:3]},
		{"crisp", StartCrisp, fmt.Sprintf("benchcrisp%d", *instance), subnet(*instance, 1), big[3:]},
	}
	for _, r := range runs {
		if *only != "" && *only != r.name {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		parent := "/bench-" + r.name
		if *instance != 0 {
			parent += fmt.Sprint(*instance)
		}
		spec := Spec{Name: r.name, Dir: filepath.Join(benchRoot, r.name), Bridge: r.bridge, Subnet: r.subnet, CgroupParent: parent,
			Registry: host, PauseImage: pause, Bin: *binDir, Metrics: *metricsOn}
		if r.name == "crisp" {
			spec.TaskShim, spec.TaskRunc = taskShimBinaries(t)
		}
		if err := os.MkdirAll(spec.Dir, 0o711); err != nil {
			t.Fatal(err)
		}
		res, version, err := runOne(ctx, t, r.start, spec, busybox, r.pulls)
		if version != "" {
			rep.Versions[r.name] = version
		}
		if res != nil {
			rep.Runtimes[r.name] = res
		}
		if err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}

	if runNRI && ctx.Err() == nil {
		res := rep.Runtimes["crisp"]
		if res == nil {
			res = Results{}
		}
		tmpl := Spec{Registry: host, PauseImage: pause, Bin: *binDir, Metrics: *metricsOn}
		version, err := runNRICost(ctx, t, benchRoot, tmpl, busybox, res)
		if _, ok := rep.Versions["crisp"]; !ok && version != "" {
			rep.Versions["crisp"] = version
		}
		if len(res) > 0 {
			rep.Runtimes["crisp"] = res
		}
		if err != nil {
			t.Errorf("NRI comparison: %v", err)
		}
	}

	if runTracing && ctx.Err() == nil {
		res := rep.Runtimes["crisp"]
		if res == nil {
			res = Results{}
		}
		tmpl := Spec{Registry: host, PauseImage: pause, Bin: *binDir, Metrics: *metricsOn}
		err := runTracingCost(ctx, t, benchRoot, tmpl, busybox, res, rep.Versions)
		if len(res) > 0 {
			rep.Runtimes["crisp"] = res
		}
		if err != nil {
			t.Errorf("tracing comparison: %v", err)
		}
	}

	if runWasm && ctx.Err() == nil {
		res := rep.Runtimes["crisp"]
		if res == nil {
			res = Results{}
		}
		tmpl := Spec{Registry: host, PauseImage: pause, Bin: *binDir}
		err := runWasmCost(ctx, t, benchRoot, tmpl, host, busybox, res)
		if len(res) > 0 {
			rep.Runtimes["crisp"] = res
		}
		if err != nil {
			t.Errorf("wasm comparison: %v", err)
		}
	}

	if (*only == "" || *only == "pull") && *pullRounds >= 0 && ctx.Err() == nil {
		t.Log("pull: the pull benchmark")
		pr, err := runPull(ctx, t, host, pause, benchRoot)
		rep.Pull = pr
		if err != nil {
			t.Errorf("pull: %v", err)
		}
	}

	var sb strings.Builder
	if len(rep.Runtimes) > 0 {
		if err := rep.WriteTable(&sb); err != nil {
			t.Fatal(err)
		}
	}
	if rep.Pull != nil {
		sb.WriteString("\n")
		if err := rep.Pull.WriteTable(&sb); err != nil {
			t.Fatal(err)
		}
	}
	fmt.Println()
	fmt.Println(sb.String())
	path, err := rep.Save(*resultsDir)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("results:", path)
}

// startRuntime starts one runtime. stop tears it down, also after a failed start (what
// it got to create): defer it at once. A start's error carries the daemon's log tail.
func startRuntime(ctx context.Context, t *testing.T, start func(context.Context, Spec) (*Daemon, error), spec Spec) (d *Daemon, stop func(), err error) {
	t.Logf("%s: starting", spec.Name)
	d, err = start(ctx, spec)
	stop = func() {
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		teardown(cctx, t, d, spec)
	}
	if err != nil && d != nil && d.logFile != nil {
		err = fmt.Errorf("%w\n%s", err, d.LogTail())
	}
	return d, stop, err
}

// runOne starts one runtime, measures it and always cleans it up.
func runOne(ctx context.Context, t *testing.T, start func(context.Context, Spec) (*Daemon, error), spec Spec, busybox string, pulls []string) (res Results, version string, err error) {
	d, stop, err := startRuntime(ctx, t, start, spec)
	defer stop()
	if err != nil {
		return nil, "", err
	}
	if v, verr := d.RT.Version(ctx, &cri.VersionRequest{}); verr == nil {
		version = v.RuntimeName + " " + v.RuntimeVersion
	}
	res = Results{}
	w := &Workload{D: d, Image: busybox}
	t.Logf("%s: pull", d.Name)
	for _, ref := range []string{busybox, spec.PauseImage} {
		if _, err := w.Pull(ctx, ref); err != nil {
			return res, version, err
		}
	}
	var pullTimes []time.Duration
	for _, ref := range pulls {
		pt, err := w.Pull(ctx, ref)
		if err != nil {
			return res, version, err
		}
		pullTimes = append(pullTimes, pt)
	}
	res.Ms("pull", Percentile(pullTimes, 50))
	time.Sleep(time.Second)
	idle, err := ReadMem(d.Pid())
	if err != nil {
		return res, version, err
	}
	res["daemon_rss_idle"] = idle.RSS / 1024
	if _, err := w.Cycles(ctx, 3); err != nil { // warm-up: caches, first CNI run
		return res, version, err
	}

	if *base {
		if err := runBase(ctx, t, w, res); err != nil {
			return res, version, err
		}
		if err := w.RemoveAll(ctx, clients); err != nil {
			return res, version, fmt.Errorf("remove the base run's pods: %w", err)
		}
	}
	if !*base && d.MetricsURL != "" {
		// The breakdown is of sequential pod starts, as the base run times them.
		t.Logf("%s: %d pod cycles for the breakdown", d.Name, *cycles)
		if _, err := w.Cycles(ctx, *cycles); err != nil {
			return res, version, err
		}
		if err := breakdown(ctx, d, res); err != nil {
			return res, version, err
		}
	}
	if spec.TaskShim != "" {
		if err := runTaskShim(ctx, t, w, res); err != nil {
			return res, version, err
		}
	}
	if *density > 0 {
		if err := runDensity(ctx, t, w, res, *density); err != nil {
			return res, version, err
		}
	}
	if *soak {
		if err := runSoak(ctx, t, w, res); err != nil {
			return res, version, err
		}
	}
	return res, version, nil
}

// runBase measures sequential pod cycles, churn, the memory of 20 pods, exec, and
// lists at 100 pods; it leaves those 100 pods.
func runBase(ctx context.Context, t *testing.T, w *Workload, res Results) error {
	d := w.D
	step := func(name string) { t.Logf("%s: %s", d.Name, name) }
	step(fmt.Sprintf("%d pod cycles", *cycles))
	cs, err := w.Cycles(ctx, *cycles)
	if err != nil {
		return err
	}
	// crisp's breakdown of these cycles (and their warm-up), before other work adds
	// concurrent pod starts to its histograms.
	if d.MetricsURL != "" {
		if err := breakdown(ctx, d, res); err != nil {
			return err
		}
	}
	pick := func(f func(CycleTimes) time.Duration) []time.Duration { return pickTimes(cs, f) }
	run := pick(func(c CycleTimes) time.Duration { return c.Run })
	res.Ms("run_pod_p50", Percentile(run, 50))
	res.Ms("run_pod_p99", Percentile(run, 99))
	res.Ms("create_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.Create }), 50))
	res.Ms("start_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.Start }), 50))
	res.Ms("create_start_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.Create + c.Start }), 50))
	res.Ms("stop_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.Stop }), 50))
	res.Ms("stop_pod_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.StopPod }), 50))
	res.Ms("remove_pod_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.Remove }), 50))
	for i, c := range cs {
		if c.Total() > 2*Percentile(pick(CycleTimes.Total), 50) {
			t.Logf("%s: slow cycle %d: %+v", d.Name, i, c)
		}
	}
	res.Ms("pod_start_p50", Percentile(pick(CycleTimes.PodStart), 50))
	total := pick(CycleTimes.Total)
	res.Ms("cycle_p50", Percentile(total, 50))
	res.Ms("cycle_p90", Percentile(total, 90))
	res.Ms("cycle_p99", Percentile(total, 99))

	step(fmt.Sprintf("churn, 10 clients, %v", *churnFor))
	cps, failed, err := w.Churn(ctx, 10, *churnFor)
	res["churn"] = cps
	if failed > 0 {
		return fmt.Errorf("churn: %d cycles failed, first: %v", failed, err)
	}

	step("20 pods for memory")
	var sleeper string
	var perPod, shim, pause Mem
	for i := range 20 {
		_, cid, err := w.PodWithSleep(ctx, fmt.Sprintf("mem%d", i))
		if err != nil {
			return err
		}
		sleeper = cid
	}
	time.Sleep(2 * time.Second)
	pods, err := d.RT.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		pid, err := w.SandboxPid(ctx, p.Id)
		if err != nil {
			return err
		}
		shimPid, err := PPid(pid)
		if err != nil {
			return err
		}
		pm, err1 := ReadMem(pid)
		sm, err2 := ReadMem(shimPid)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("memory of pod %s: %v %v", p.Id, err1, err2)
		}
		shim, pause = shim.Add(sm), pause.Add(pm)
		perPod = perPod.Add(sm).Add(pm)
		if p == pods.Items[0] {
			t.Logf("%s: sandbox process %d (%s), its parent %d (%s)", d.Name, pid, Comm(pid), shimPid, Comm(shimPid))
		}
	}
	n := float64(len(pods.Items))
	perPod, shim, pause = perPod.Div(n*1024), shim.Div(n*1024), pause.Div(n*1024)
	res["pod_pss"], res["pod_uss"], res["pod_rss"] = perPod.PSS, perPod.USS, perPod.RSS
	res["shim_pss"], res["shim_uss"], res["pause_pss"] = shim.PSS, shim.USS, pause.PSS
	if *hold > 0 {
		step(fmt.Sprintf("holding the 20 pods for %v", *hold))
		select {
		case <-ctx.Done():
		case <-time.After(*hold):
		}
	}
	dm, err := ReadMem(d.Pid())
	if err != nil {
		return err
	}
	res["daemon_rss_20"] = dm.RSS / 1024
	if anon, err := RssAnon(d.Pid()); err == nil {
		res["daemon_anon_20"] = anon / 1024
	}

	step("exec")
	ex, err := w.ExecLatency(ctx, sleeper, 100)
	if err != nil {
		return err
	}
	res.Ms("exec_p50", Percentile(ex, 50))
	res.Ms("exec_p99", Percentile(ex, 99))

	step("100 pods, 200 containers for lists")
	lp, lc, err := w.ListLatency(ctx, 100, 100)
	if err != nil {
		return err
	}
	var vs []time.Duration
	for range 200 {
		t0 := time.Now()
		if _, err := d.RT.Version(ctx, &cri.VersionRequest{}); err != nil {
			return err
		}
		vs = append(vs, time.Since(t0))
	}
	// An RPC that does no work: what any list call costs at least on this client.
	res.Ms("version_p50", Percentile(vs, 50))
	res.Ms("list_pods_p50", Percentile(lp, 50))
	res.Ms("list_ctrs_p50", Percentile(lc, 50))
	return nil
}

// teardown removes the runtime's pods, stops it and removes whatever it left: shim
// and container processes (by the pids found under its files and cgroups), mounts,
// its bridge, cgroups and files.
func teardown(ctx context.Context, t *testing.T, d *Daemon, spec Spec) {
	if d != nil && d.RT != nil {
		t.Logf("%s: removing pods", d.Name)
		if err := d.RemoveAllPods(ctx); err != nil {
			t.Errorf("%s: remove pods: %v", d.Name, err)
		}
	}
	if d != nil {
		d.Stop()
	}
	parent := spec.CgroupParent
	for _, pid := range leftoverPids(spec.Dir, parent) {
		t.Logf("%s: killing leftover process %d (%s)", spec.Name, pid, Comm(pid))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	for _, m := range mountsUnder(spec.Dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", m, err)
		}
	}
	if out, err := exec.CommandContext(ctx, "ip", "link", "del", spec.Bridge).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find device") {
		t.Errorf("delete bridge %s: %v %s", spec.Bridge, err, out)
	}
	removeCgroups(parent)
	if err := os.RemoveAll(spec.Dir); err != nil {
		t.Errorf("remove %s: %v", spec.Dir, err)
	}
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// leftoverPids are processes whose command line names dir (shims) or that live in a
// cgroup under parent (pause and container processes).
func leftoverPids(dir, parent string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == self {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if strings.Contains(string(cmdline), dir+"/") || strings.Contains(string(cmdline), dir+"\x00") ||
			strings.Contains(string(cg), ":"+parent+"/") {
			out = append(out, pid)
		}
	}
	return out
}

// removeCgroups removes the cgroup parent, deepest first, in every hierarchy.
func removeCgroups(parent string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, root := range roots {
		top := filepath.Join(root, parent)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// bigImage is ~50 MB in 5 layers of random data, distinct per seed.
func bigImage(t *testing.T, seed uint64) v1.Image {
	var layers []v1.Layer
	for i := range 5 {
		layers = append(layers, imagetest.NewLayer(t, imagetest.OCI, imagetest.Gzip,
			imagetest.Dir("data"), imagetest.RandomFile(fmt.Sprintf("data/layer%d", i), 10<<20, seed*10+uint64(i))))
	}
	return imagetest.NewImage(t, imagetest.ImageOptions{Config: v1.Config{Cmd: []string{"/bin/sh"}}}, layers...)
}

// taskShimBinaries finds containerd's runc shim and runc in -task-shim; "" when the
// comparison is off or they are not built (hack/containerd.sh builds them).
func taskShimBinaries(t *testing.T) (shim, runc string) {
	if *taskShim == "" {
		return "", ""
	}
	shim, runc = filepath.Join(*taskShim, "containerd-shim-runc-v2"), filepath.Join(*taskShim, "runc")
	for _, p := range []string{shim, runc} {
		if _, err := os.Stat(p); err != nil {
			t.Logf("task shim comparison skipped: %v (hack/containerd.sh builds it)", err)
			return "", ""
		}
	}
	return shim, runc
}

// runTaskShim times -cycles pod cycles on the task-only handler, without and with a
// warm spare, each next to one on crisp's own shim, so that all see the same machine.
func runTaskShim(ctx context.Context, t *testing.T, w *Workload, res Results) error {
	t.Logf("%s: %d pod cycles on containerd's runc shim (without and with a warm spare), interleaved with its own", w.D.Name, *cycles)
	runs := []struct {
		w      *Workload
		prefix string
		cs     []CycleTimes
	}{
		{w: w, prefix: "task_own_"},
		{w: &Workload{D: w.D, Image: w.Image, Handler: TaskShimHandler}, prefix: "task_"},
		{w: &Workload{D: w.D, Image: w.Image, Handler: TaskShimSpareHandler}, prefix: "task_spare_"},
	}
	for _, r := range runs[1:] {
		if _, err := r.w.Cycles(ctx, 3); err != nil { // warm-up
			return fmt.Errorf("handler %q: %w", r.w.Handler, err)
		}
	}
	for range *cycles {
		for i := range runs {
			c, err := runs[i].w.Cycle(ctx)
			if err != nil {
				return fmt.Errorf("handler %q: %w", runs[i].w.Handler, err)
			}
			runs[i].cs = append(runs[i].cs, c)
		}
	}
	for _, r := range runs {
		pick := func(f func(CycleTimes) time.Duration) []time.Duration { return pickTimes(r.cs, f) }
		start := pick(CycleTimes.PodStart)
		res.Ms(r.prefix+"pod_start_p50", Percentile(start, 50))
		res.Ms(r.prefix+"pod_start_p99", Percentile(start, 99))
		res.Ms(r.prefix+"run_pod_p50", Percentile(pick(func(c CycleTimes) time.Duration { return c.Run }), 50))
		res.Ms(r.prefix+"cycle_p50", Percentile(pick(CycleTimes.Total), 50))
	}
	return nil
}
