package e2e

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/crisp-runtime/crisp/internal/image/imagetest"
)

// Messages of criserver's reload, as its log has them.
const (
	reloadedMsg = "config reloaded"
	refusedMsg  = "config reload refused: the settings in force are unchanged"
	restartMsg  = "config keys changed that take effect only when criserver restarts; they keep their running values until then"
)

// logRecords returns criserver's JSON log records with message msg, in order, and
// the size of the log when it was read.
func (e *env) logRecords(msg string) ([]map[string]any, int) {
	e.t.Helper()
	data, err := os.ReadFile(e.logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(string(data), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out, len(data)
}

// waitRecords waits until the log has n records with message msg and returns them,
// failing the test at once if criserver is gone.
func (e *env) waitRecords(msg string, n int) []map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		recs, _ := e.logRecords(msg)
		if len(recs) >= n {
			return recs
		}
		if !alive(e.cmd.Process.Pid) {
			e.t.Fatalf("criserver is gone, waiting for log record %d %q; log:\n%s", n, msg, e.log())
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%d log records %q, want %d; log:\n%s", len(recs), msg, n, e.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// strs is a JSON list of strings from a log record; nil for anything else.
func strs(v any) []string {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	out := []string{}
	for _, x := range list {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// hup sends criserver SIGHUP.
func (e *env) hup() {
	e.t.Helper()
	if err := e.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		e.t.Fatalf("SIGHUP: %v", err)
	}
}

// startHUPEarly starts criserver as start does, but sends it SIGHUP as soon as it
// logs that it is starting, and then waits for it to serve. It reports whether the
// signal went out before the CRI socket existed.
func (e *env) startHUPEarly() (beforeSocket bool) {
	e.t.Helper()
	e.launch()
	e.waitRecords("criserver starting", 1)
	_, statErr := os.Stat(e.socket)
	e.hup()
	// waitServing fails the test if criserver exits: a SIGHUP during its start.
	e.waitServing()
	return statErr != nil
}

// TestE2EReload: SIGHUP applies a changed log level, registry mirror and pinned list
// to a running criserver without touching its pods, warns about a changed key that
// needs a restart, and refuses a bad file whole, keeping the settings in force; a
// SIGHUP during the start does not end criserver.
func TestE2EReload(t *testing.T) {
	e := newEnv(t)
	base := e.enableMetrics()
	initial, err := os.ReadFile(e.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(initial), "log_level = \"debug\"\n") {
		t.Fatalf("the harness's config no longer sets log_level = \"debug\":\n%s", initial)
	}
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "reload/busybox:1", imagetest.BusyboxImage(t, imagetest.OCI, imagetest.Gzip))
	ref := host + "/reload/busybox:1"
	// A registry name that does not resolve: pullable only once a mirror is configured.
	const mirrored = "registry.crisp.invalid"
	viaMirror := mirrored + "/reload/busybox:1"

	// A SIGHUP while criserver starts is a reload of the unchanged file, not its end.
	if !e.startHUPEarly() {
		t.Log("criserver created its socket before the SIGHUP went out: the signal did not land during the start this time")
	}
	if recs := e.waitRecords(reloadedMsg, 1); !slices.Equal(strs(recs[0]["changed"]), []string{}) {
		t.Errorf("reload of the unchanged file: changed %v", recs[0]["changed"])
	}
	ctx := ctxT(t)
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_config_reloads_total{result="success"}`:       1,
		`crisp_config_reloads_total{result="failure"}`:       0,
		`crisp_config_last_reload_success_timestamp_seconds`: -1,
	})

	if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: ref}}); err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	podCfg := e.podConfig("reload")
	pod := e.runPod(ctx, podCfg)
	ctr := e.runCtr(ctx, pod, podCfg, ctrConfig("sleeper", ref, "sleep", "3600"))
	_, info := e.status(ctx, pod)
	if st := e.imageStatus(ctx, ref); st.Pinned {
		t.Fatalf("%s pinned before any pinned list", ref)
	}
	if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: viaMirror}}); err == nil {
		t.Fatalf("pull %s succeeded without a mirror", viaMirror)
	}
	// At debug, every CRI call is logged.
	if recs, _ := e.logRecords("CRI call"); len(recs) == 0 {
		t.Fatal("no debug record of CRI calls at log_level debug")
	}

	// The reload: log level, a mirror, a pinned image, and a key that needs a restart.
	changed := strings.Replace(string(initial), "log_level = \"debug\"", "log_level = \"info\"", 1) +
		"[registry.mirrors]\n\"" + mirrored + "\" = [\"http://" + host + "\"]\n" +
		"[image]\npinned = [\"" + ref + "\"]\n" +
		"[streaming]\nidle_timeout_seconds = 600\n"
	e.writeConfig(changed)
	e.hup()
	recs := e.waitRecords(reloadedMsg, 2)
	want := []string{"image.pinned", "log_level", "registry.mirrors"}
	if got := strs(recs[1]["changed"]); !slices.Equal(got, want) {
		t.Errorf("reload: changed %q, want %q", got, want)
	}
	if warn := e.waitRecords(restartMsg, 1); !slices.Equal(strs(warn[0]["keys"]), []string{"streaming.idle_timeout_seconds"}) || warn[0]["level"] != "WARN" {
		t.Errorf("restart warning: %v", warn[0])
	}
	_, mark := e.logRecords(reloadedMsg)
	e.checkReloaded(ctx, ref, viaMirror, mark)
	e.checkPodRuns(ctx, pod, ctr, info.ShimPid)
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_config_reloads_total{result="success"}`: 2,
		`crisp_config_reloads_total{result="failure"}`: 0,
	})

	// A bad file: refused, with the key named; the settings in force stay. It also
	// drops the mirror and the pinned list, which must not be applied either.
	e.writeConfig(strings.Replace(string(initial), "log_level = \"debug\"", "log_level = \"loud\"", 1))
	e.hup()
	refused := e.waitRecords(refusedMsg, 1)
	if msg, _ := refused[0]["err"].(string); refused[0]["level"] != "ERROR" || !strings.Contains(msg, "log_level") || !strings.Contains(msg, "loud") {
		t.Errorf("refusal: %v, want an error naming log_level and the value", refused[0])
	}
	_, mark = e.logRecords(refusedMsg)
	e.checkReloaded(ctx, ref, viaMirror, mark)
	e.checkPodRuns(ctx, pod, ctr, info.ShimPid)
	checkSeries(t, scrape(t, base), map[string]float64{
		`crisp_config_reloads_total{result="success"}`: 2,
		`crisp_config_reloads_total{result="failure"}`: 1,
	})
	if n, _ := e.logRecords(reloadedMsg); len(n) != 2 {
		t.Errorf("%d successful reloads logged, want 2", len(n))
	}
}

// writeConfig replaces the env's config file.
func (e *env) writeConfig(content string) {
	e.t.Helper()
	if err := os.WriteFile(e.cfgPath, []byte(content), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) imageStatus(ctx context.Context, ref string) *cri.Image {
	e.t.Helper()
	st, err := e.img.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: ref}})
	if err != nil || st.Image == nil {
		e.t.Fatalf("ImageStatus %s: %v %v", ref, st, err)
	}
	return st.Image
}

// checkReloaded checks that the settings of the good reload are in force: ref is
// pinned, viaMirror pulls through the mirror, and nothing is logged at debug since
// the log was mark bytes long.
func (e *env) checkReloaded(ctx context.Context, ref, viaMirror string, mark int) {
	e.t.Helper()
	if st := e.imageStatus(ctx, ref); !st.Pinned {
		e.t.Errorf("%s not pinned", ref)
	}
	if _, err := e.img.PullImage(ctx, &cri.PullImageRequest{Image: &cri.ImageSpec{Image: viaMirror}}); err != nil {
		e.t.Errorf("pull %s through the mirror: %v", viaMirror, err)
	}
	if st := e.imageStatus(ctx, viaMirror); !st.Pinned || st.Id != e.imageStatus(ctx, ref).Id {
		e.t.Errorf("%s: pinned %v, id %s; want the pinned image of %s", viaMirror, st.Pinned, st.Id, ref)
	}
	data, err := os.ReadFile(e.logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	if strings.Contains(string(data[mark:]), `"level":"DEBUG"`) {
		e.t.Errorf("debug records logged at log_level info:\n%s", data[mark:])
	}
}

// checkPodRuns checks that the pod is ready with the shim it had and its container
// runs.
func (e *env) checkPodRuns(ctx context.Context, pod, ctr string, shimPid int) {
	e.t.Helper()
	st, info := e.status(ctx, pod)
	if st.State != cri.PodSandboxState_SANDBOX_READY || info.ShimPid != shimPid || !alive(shimPid) {
		e.t.Errorf("pod: state %v, shim %d (was %d, alive %v)", st.State, info.ShimPid, shimPid, alive(shimPid))
	}
	cs, err := e.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: ctr})
	if err != nil || cs.Status.State != cri.ContainerState_CONTAINER_RUNNING {
		e.t.Errorf("container: %v %v, want running", cs.GetStatus().GetState(), err)
	}
}
