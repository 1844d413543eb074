package nri

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/config"
	"github.com/crisp-runtime/crisp/internal/nri/nritest"
)

// testRuntime is the CRI side as NRI sees it: a fixed state, and a record of the
// updates and evictions plugins ask for.
type testRuntime struct {
	pods []Pod
	ctrs []Container

	mu      sync.Mutex
	updates map[string]*api.LinuxResources
	evicted []string
	changed chan struct{}
}

func newTestRuntime() *testRuntime {
	return &testRuntime{updates: map[string]*api.LinuxResources{}, changed: make(chan struct{}, 16)}
}

func (r *testRuntime) Pods() []Pod             { return r.pods }
func (r *testRuntime) Containers() []Container { return r.ctrs }
func (r *testRuntime) UpdateContainer(_ context.Context, id string, res *api.LinuxResources) error {
	r.mu.Lock()
	r.updates[id] = res
	r.mu.Unlock()
	r.changed <- struct{}{}
	return nil
}
func (r *testRuntime) EvictContainer(_ context.Context, id, _ string) error {
	r.mu.Lock()
	r.evicted = append(r.evicted, id)
	r.mu.Unlock()
	r.changed <- struct{}{}
	return nil
}

func testConfig(t *testing.T) config.NRIConfig {
	cfg := config.Default().NRI
	cfg.Disable = false
	dir := t.TempDir()
	cfg.SocketPath = filepath.Join(dir, "nri.sock")
	cfg.PluginPath = filepath.Join(dir, "plugins")
	cfg.PluginConfigPath = filepath.Join(dir, "conf.d")
	cfg.PluginRequestTimeout = config.Duration(500 * time.Millisecond)
	return cfg
}

func startNRI(t *testing.T, cfg config.NRIConfig, rt Runtime) *NRI {
	t.Helper()
	n, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(rt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return n
}

// syncer is the Synchronize every test plugin embeds: startPlugin waits for it.
type syncer struct{ synced chan []*api.Container }

func newSyncer() *syncer { return &syncer{synced: make(chan []*api.Container, 1)} }

func (s *syncer) Synchronize(_ context.Context, _ []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	s.synced <- ctrs
	return nil, nil
}

func (s *syncer) syncedWith() chan []*api.Container { return s.synced }

type testPlugin interface {
	syncedWith() chan []*api.Container
}

// startPlugin connects p, with the stub's opts, to n and waits until n has it among
// its plugins; it returns the plugin's stub and the containers it was synchronized with.
func startPlugin(t *testing.T, n *NRI, socket, name, idx string, p testPlugin, opts ...stub.Option) (stub.Stub, []*api.Container) {
	t.Helper()
	st, err := stub.New(p, append([]stub.Option{stub.WithSocketPath(socket), stub.WithPluginName(name), stub.WithPluginIdx(idx)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	// The stub serves the plugin's handlers under this context: it must outlive the test.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := st.Start(ctx); err != nil {
		t.Fatalf("start plugin %s: %v", name, err)
	}
	t.Cleanup(st.Stop)
	var ctrs []*api.Container
	select {
	case ctrs = <-p.syncedWith():
	case <-time.After(10 * time.Second):
		t.Fatalf("plugin %s was not synchronized", name)
	}
	// The library adds the plugin once its Synchronize has returned, and lets sync
	// blocks through only after that.
	n.BlockSync().Unblock()
	return st, ctrs
}

func TestDisabledIsNil(t *testing.T) {
	n, err := New(config.Default().NRI, slog.Default(), nil)
	if err != nil || n != nil {
		t.Fatalf("New(default) = %v, %v; want nil, nil (NRI is off by default)", n, err)
	}
	ctx := context.Background()
	// Every entry point is a no-op on the nil NRI.
	if err := n.Start(nil); err != nil {
		t.Fatal(err)
	}
	n.BlockSync().Unblock()
	if err := n.RunPodSandbox(ctx, Pod{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateContainer(ctx, Pod{}, Container{}); err != nil {
		t.Fatal(err)
	}
	if r, err := n.UpdateContainer(ctx, Pod{}, Container{}, nil); r != nil || err != nil {
		t.Fatal(r, err)
	}
	n.StopContainer(ctx, Pod{}, Container{})
	n.RemoveContainer(ctx, Pod{}, Container{})
	n.Stop()
}

func TestStartFailsOnUnusableSocket(t *testing.T) {
	cfg := testConfig(t)
	// A socket path under a regular file cannot be created.
	cfg.SocketPath = "/dev/null/nri.sock"
	n, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(newTestRuntime()); err == nil {
		n.Stop()
		t.Fatal("Start with a socket under /dev/null succeeded")
	}
}

// adjuster adds one of each adjustment at CreateContainer.
type adjuster struct{ *syncer }

func (a *adjuster) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	adj.AddEnv("NRI_INJECTED", "yes")
	adj.AddAnnotation("nri.test/annotation", "set")
	adj.AddMount(&api.Mount{Source: "/tmp", Destination: "/nri-mount", Type: "bind", Options: []string{"rbind", "ro"}})
	adj.AddRlimit("RLIMIT_NOFILE", 1000, 500)
	adj.SetLinuxMemoryLimit(64 << 20)
	adj.SetLinuxCPUSetCPUs("0")
	adj.SetLinuxOomScoreAdj(api.Int(500).Get())
	adj.AddHooks(&api.Hooks{Prestart: []*api.Hook{{Path: "/bin/true"}}})
	up := &api.ContainerUpdate{}
	up.SetContainerId("other")
	up.SetLinuxCPUShares(7)
	return adj, []*api.ContainerUpdate{up}, nil
}

func testSpec() *rspec.Spec {
	return &rspec.Spec{
		Process: &rspec.Process{Args: []string{"sh"}, Env: []string{"PATH=/bin"}},
		Mounts:  []rspec.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}},
		Linux:   &rspec.Linux{Resources: &rspec.LinuxResources{}},
	}
}

func TestCreateContainerAppliesAdjustments(t *testing.T) {
	cfg := testConfig(t)
	rt := newTestRuntime()
	n := startNRI(t, cfg, rt)
	startPlugin(t, n, cfg.SocketPath, "adjuster", "10", &adjuster{newSyncer()})

	s := testSpec()
	if _, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: "c", PodID: "p", Spec: s}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "NRI_INJECTED=yes") || !slices.Contains(s.Process.Env, "PATH=/bin") {
		t.Errorf("env = %q", s.Process.Env)
	}
	if s.Annotations["nri.test/annotation"] != "set" {
		t.Errorf("annotations = %v", s.Annotations)
	}
	if !slices.ContainsFunc(s.Mounts, func(m rspec.Mount) bool { return m.Destination == "/nri-mount" && m.Source == "/tmp" }) {
		t.Errorf("mounts = %+v", s.Mounts)
	}
	if !slices.ContainsFunc(s.Process.Rlimits, func(r rspec.POSIXRlimit) bool {
		return r.Type == "RLIMIT_NOFILE" && r.Hard == 1000 && r.Soft == 500
	}) {
		t.Errorf("rlimits = %+v", s.Process.Rlimits)
	}
	if m := s.Linux.Resources.Memory; m == nil || m.Limit == nil || *m.Limit != 64<<20 {
		t.Errorf("memory = %+v", m)
	}
	if c := s.Linux.Resources.CPU; c == nil || c.Cpus != "0" {
		t.Errorf("cpu = %+v", c)
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != 500 {
		t.Errorf("oom score adj = %v", s.Process.OOMScoreAdj)
	}
	// NRI's prestart hooks land in the spec's (deprecated) prestart list, as in containerd.
	//lint:ignore SA1019 NRI adjusts Prestart
	if h := s.Hooks; h == nil || len(h.Prestart) != 1 || h.Prestart[0].Path != "/bin/true" {
		t.Errorf("hooks = %+v", s.Hooks)
	}
	// The update of another container that came with the create went through the runtime.
	select {
	case <-rt.changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no update of the other container")
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if u := rt.updates["other"]; u == nil || u.GetCpu().GetShares().GetValue() != 7 {
		t.Errorf("update of other = %v", u)
	}
}

// conflicting sets the same env var as adjuster: the library refuses two plugins
// owning one setting.
type conflicting struct{ *syncer }

func (conflicting) CreateContainer(_ context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	adj := &api.ContainerAdjustment{}
	adj.AddEnv("NRI_INJECTED", "no")
	return adj, nil, nil
}

func TestConflictingAdjustmentsFailCreate(t *testing.T) {
	cfg := testConfig(t)
	n := startNRI(t, cfg, newTestRuntime())
	startPlugin(t, n, cfg.SocketPath, "adjuster", "10", &adjuster{newSyncer()})
	startPlugin(t, n, cfg.SocketPath, "conflicting", "20", conflicting{newSyncer()})
	_, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: "c", PodID: "p", Spec: testSpec()})
	if err == nil {
		t.Fatal("conflicting adjustments did not fail the create")
	}
	t.Logf("error: %v", err)
}

// hanging never answers CreateContainer within the request timeout.
type hanging struct {
	*syncer
	release chan struct{}
}

func (h hanging) CreateContainer(ctx context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return nil, nil, nil
}

func TestHangingPluginIsDisconnected(t *testing.T) {
	cfg := testConfig(t)
	n := startNRI(t, cfg, newTestRuntime())
	h := hanging{syncer: newSyncer(), release: make(chan struct{})}
	defer close(h.release)
	startPlugin(t, n, cfg.SocketPath, "hanging", "10", h)
	begin := time.Now()
	s := testSpec()
	// As in containerd: the library drops the plugin that timed out and the create
	// goes on without it.
	if _, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: "c", PodID: "p", Spec: s}); err != nil {
		t.Fatalf("create with a hanging plugin: %v", err)
	}
	t.Logf("first create: %v", time.Since(begin))
	if d := time.Since(begin); d < 400*time.Millisecond || d > 5*time.Second {
		t.Errorf("create took %v; want about the request timeout (500ms)", d)
	}
	// The library drops the closed plugin once its connection is seen closed (not
	// always by the next call): later creates go on, and never wait longer than the
	// timeout.
	for _, id := range []string{"c2", "c3"} {
		begin = time.Now()
		if _, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: id, PodID: "p", Spec: testSpec()}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(begin); d > 2*time.Second {
			t.Errorf("create %s took %v", id, d)
		}
	}
}

func TestSynchronizeAndUnsolicitedUpdate(t *testing.T) {
	cfg := testConfig(t)
	rt := newTestRuntime()
	rt.pods = []Pod{{ID: "p1", Name: "pod", Namespace: "ns"}}
	rt.ctrs = []Container{{ID: "c1", PodID: "p1", Name: "ctr", State: runtime.ContainerState_CONTAINER_RUNNING,
		Resources: &runtime.LinuxContainerResources{CpusetCpus: "0", MemoryLimitInBytes: 1 << 30}}}
	n := startNRI(t, cfg, rt)
	st, got := startPlugin(t, n, cfg.SocketPath, "sync", "10", &adjuster{newSyncer()})
	if len(got) != 1 || got[0].GetId() != "c1" || got[0].GetState() != api.ContainerState_CONTAINER_RUNNING ||
		got[0].GetLinux().GetResources().GetCpu().GetCpus() != "0" || got[0].GetLinux().GetResources().GetMemory().GetLimit().GetValue() != 1<<30 {
		t.Fatalf("synchronized containers = %v", got)
	}
	if n.getState("c1") != stateRunning {
		t.Errorf("state of c1 after sync = %v", n.getState("c1"))
	}

	up := &api.ContainerUpdate{}
	up.SetContainerId("c1")
	up.SetLinuxCPUSetCPUs("1")
	failed, err := st.UpdateContainers([]*api.ContainerUpdate{up})
	if err != nil || len(failed) != 0 {
		t.Fatalf("UpdateContainers = %v, %v", failed, err)
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if u := rt.updates["c1"]; u.GetCpu().GetCpus() != "1" {
		t.Errorf("update of c1 = %v", u)
	}
}

// events records the lifecycle events a plugin sees, by id.
type events struct {
	*syncer
	nritest.Recorder
}

func TestEachStopAndRemoveSentOnce(t *testing.T) {
	cfg := testConfig(t)
	n := startNRI(t, cfg, newTestRuntime())
	ev := &events{syncer: newSyncer(), Recorder: nritest.Recorder{ByID: true}}
	startPlugin(t, n, cfg.SocketPath, "events", "10", ev)
	ctx := context.Background()
	p := Pod{ID: "p"}
	c := Container{ID: "c", PodID: "p", Spec: testSpec()}
	if err := n.RunPodSandbox(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := n.CreateContainer(ctx, p, c); err != nil {
		t.Fatal(err)
	}
	if err := n.StartContainer(ctx, p, c); err != nil {
		t.Fatal(err)
	}
	// The exit, StopContainer and StopPodSandbox all report the stop.
	n.StopContainer(ctx, p, c)
	n.StopContainer(ctx, p, c)
	n.StopPodSandbox(ctx, p)
	n.RemoveContainer(ctx, p, c)
	n.RemoveContainer(ctx, p, c)
	n.RemovePodSandbox(ctx, p)
	want := []string{"RunPodSandbox p", "StartContainer c", "StopContainer c", "StopPodSandbox p", "RemoveContainer c", "RemovePodSandbox p"}
	if got := ev.Events(); !slices.Equal(got, want) {
		t.Errorf("events = %q, want %q", got, want)
	}
}

func TestResourcesRoundTrip(t *testing.T) {
	in := &runtime.LinuxContainerResources{CpuShares: 512, CpuQuota: 50000, CpuPeriod: 100000, CpusetCpus: "0-1", CpusetMems: "0",
		MemoryLimitInBytes: 1 << 28, HugepageLimits: []*runtime.HugepageLimit{{PageSize: "2MB", Limit: 1 << 21}}, Unified: map[string]string{"memory.high": "1"}}
	out := ToCRIResources(FromCRIResources(in), 0)
	if out.String() != in.String() {
		t.Errorf("round trip: %v, want %v", out, in)
	}
}

func TestAdjustSpecClasses(t *testing.T) {
	n := &NRI{}
	rdt := &api.ContainerAdjustment{}
	rdt.SetLinuxRDTClass("gold")
	s := testSpec()
	if err := n.AdjustSpec(s, rdt); err != nil || s.Linux.IntelRdt == nil || s.Linux.IntelRdt.ClosID != "gold" {
		t.Errorf("RDT class: %v, %+v", err, s.Linux.IntelRdt)
	}
	bio := &api.ContainerAdjustment{}
	bio.SetLinuxBlockIOClass("slow")
	if err := n.AdjustSpec(testSpec(), bio); err == nil || !strings.Contains(err.Error(), `"slow"`) {
		t.Errorf("block I/O class: %v, want an error naming it", err)
	}
	cdi := &api.ContainerAdjustment{}
	cdi.AddCDIDevice(&api.CDIDevice{Name: "vendor.com/gpu=0"})
	if err := n.AdjustSpec(testSpec(), cdi); err == nil || !strings.Contains(err.Error(), "CDI is off") {
		t.Errorf("CDI device without CDI: %v", err)
	}
}

// buildPlugin builds testdata/plugin into cfg's plugin_path as name, with config as
// its plugin_config_path configuration.
func buildPlugin(t *testing.T, cfg config.NRIConfig, name, config string) {
	t.Helper()
	for _, d := range []string{cfg.PluginPath, cfg.PluginConfigPath} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command("go", "build", "-o", filepath.Join(cfg.PluginPath, name), "./testdata/plugin")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the test plugin: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(cfg.PluginConfigPath, name+".conf"), []byte(config+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestPreRegisteredPlugin: criserver starts the plugins of plugin_path with their
// configuration from plugin_config_path.
func TestPreRegisteredPlugin(t *testing.T) {
	cfg := testConfig(t)
	buildPlugin(t, cfg, "05-prereg", "from-conf.d")
	n := startNRI(t, cfg, newTestRuntime())
	s := testSpec()
	if _, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: "c", PodID: "p", Spec: s}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.Process.Env, "PREREGISTERED=from-conf.d") {
		t.Errorf("env %q lacks the pre-registered plugin's PREREGISTERED=from-conf.d", s.Process.Env)
	}
}

// TestCrashingPlugin: a plugin that dies while handling CreateContainer is dropped
// and the create goes on without it, as in containerd.
func TestCrashingPlugin(t *testing.T) {
	cfg := testConfig(t)
	buildPlugin(t, cfg, "05-crash", "crash")
	n := startNRI(t, cfg, newTestRuntime())
	a := &adjuster{newSyncer()}
	startPlugin(t, n, cfg.SocketPath, "adjuster", "10", a)
	for _, id := range []string{"c1", "c2"} {
		s := testSpec()
		if _, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: id, PodID: "p", Spec: s}); err != nil {
			t.Fatalf("create %s after the plugin crashed: %v", id, err)
		}
		// The other plugin still adjusts.
		if !slices.Contains(s.Process.Env, "NRI_INJECTED=yes") {
			t.Errorf("create %s: env %q lacks the surviving plugin's adjustment", id, s.Process.Env)
		}
	}
}

// order records the order plugins are called in.
type order struct {
	*syncer
	name string
	log  *[]string
	mu   *sync.Mutex
}

func (o order) CreateContainer(context.Context, *api.PodSandbox, *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	o.mu.Lock()
	*o.log = append(*o.log, o.name)
	o.mu.Unlock()
	return nil, nil, nil
}

// TestPluginsOrderedByIndex: plugins are called in the order of their index,
// whatever the order they connected in.
func TestPluginsOrderedByIndex(t *testing.T) {
	cfg := testConfig(t)
	n := startNRI(t, cfg, newTestRuntime())
	var log []string
	var mu sync.Mutex
	for _, p := range []struct{ name, idx string }{{"late", "90"}, {"early", "05"}, {"middle", "50"}} {
		startPlugin(t, n, cfg.SocketPath, p.name, p.idx, order{syncer: newSyncer(), name: p.name, log: &log, mu: &mu})
	}
	if _, err := n.CreateContainer(context.Background(), Pod{ID: "p"}, Container{ID: "c", PodID: "p", Spec: testSpec()}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"early", "middle", "late"}; !slices.Equal(log, want) {
		t.Errorf("plugins called in order %q, want %q", log, want)
	}
}

// TestEvictionsReachTheRuntime: the library v0.12.3 drops a plugin's evictions before
// they reach a runtime, so no plugin can drive this end to end; the evictions an
// answer carries must still stop exactly the containers named, failures logged, once a
// library version passes them on.
func TestEvictionsReachTheRuntime(t *testing.T) {
	rt := newTestRuntime()
	n := startNRI(t, testConfig(t), rt)
	n.evict(context.Background(), "update", []*api.ContainerEviction{
		{ContainerId: "c1", Reason: "over its budget"},
		{ContainerId: "c2", Reason: "over its budget"},
	})
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if want := []string{"c1", "c2"}; !slices.Equal(rt.evicted, want) {
		t.Fatalf("evicted %v, want %v", rt.evicted, want)
	}
}

// slowStop answers StopContainer only once release is closed, with an update of
// "sibling", and records the events it sees.
type slowStop struct {
	*syncer
	nritest.Recorder
	release chan struct{}
}

func (s *slowStop) StopContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	<-s.release
	s.Record("StopContainer " + c.GetId())
	u := &api.ContainerUpdate{}
	u.SetContainerId("sibling")
	u.SetLinuxCPUShares(512)
	return []*api.ContainerUpdate{u}, nil
}

func (s *slowStop) RemoveContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) error {
	s.Record("RemoveContainer " + c.GetId())
	return nil
}

// An exit is delivered in the background: NotifyContainerExit returns while the
// plugin still holds the stop, a RemoveContainer meanwhile waits for it (plugins see
// the stop first), and the update the plugin answers with is applied.
func TestExitNotifiedInBackground(t *testing.T) {
	cfg := testConfig(t)
	cfg.PluginRequestTimeout = config.Duration(10 * time.Second)
	rt := newTestRuntime()
	n := startNRI(t, cfg, rt)
	pl := &slowStop{syncer: newSyncer(), Recorder: nritest.Recorder{ByID: true}, release: make(chan struct{})}
	startPlugin(t, n, cfg.SocketPath, "slow", "10", pl)
	ctx := context.Background()
	p := Pod{ID: "p"}
	c := Container{ID: "c", PodID: "p", Spec: testSpec()}
	if _, err := n.CreateContainer(ctx, p, c); err != nil {
		t.Fatal(err)
	}
	if err := n.StartContainer(ctx, p, c); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	n.NotifyContainerExit(p, c)
	if d := time.Since(begin); d > 200*time.Millisecond {
		t.Errorf("NotifyContainerExit took %v: it waited for the plugin", d)
	}
	removed := make(chan struct{})
	go func() {
		defer close(removed)
		n.RemoveContainer(ctx, p, c)
	}()
	select {
	case <-removed:
		t.Fatal("RemoveContainer returned before the exit's StopContainer was answered")
	case <-time.After(300 * time.Millisecond):
	}
	close(pl.release)
	select {
	case <-removed:
	case <-time.After(5 * time.Second):
		t.Fatal("RemoveContainer still waits after the plugin answered the stop")
	}
	if got, want := pl.Events(), []string{"StartContainer c", "StopContainer c", "RemoveContainer c"}; !slices.Equal(got, want) {
		t.Errorf("events = %q, want %q", got, want)
	}
	select {
	case <-rt.changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin's update of the sibling was not applied")
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.updates["sibling"].GetCpu().GetShares().GetValue() != 512 {
		t.Errorf("sibling update = %v, want cpu shares 512", rt.updates["sibling"])
	}
}
