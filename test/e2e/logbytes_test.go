package e2e

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

// logCases are container outputs and what kubelet's log reader must give back for
// them: the bytes written (a CR before a newline goes, as with containerd).
var logCases = []struct {
	name, script, stdout, stderr string
}{
	// kubelet's termination message from logs (FallbackToLogsOnError) is this text.
	{"unterminated", "printf DONE; exit 1", "DONE", ""},
	{"lines and an unterminated last", `printf 'a\nb\nlast'`, "a\nb\nlast", ""},
	{"terminated", `printf 'DONE\n'`, "DONE\n", ""},
	{"crlf", `printf 'a\r\nb\r\n'`, "a\nb\n", ""},
	// 20000 bytes: longer than the 16 KiB a record holds.
	{"long unterminated", `i=0; while [ $i -lt 2000 ]; do printf 0123456789; i=$((i+1)); done`, strings.Repeat("0123456789", 2000), ""},
	{"both streams", `printf 'out\nmore'; printf 'err' >&2`, "out\nmore", "err"},
}

// checkLogBytes runs each case as a container of podID and reads its log back with
// kubelet's own reader (k8s.io/cri-client/pkg/logs, what kubectl logs and the
// termination message use).
func (e *env) checkLogBytes(ctx context.Context, t *testing.T, podID string, pod *cri.PodSandboxConfig, img string) {
	t.Helper()
	for _, lc := range logCases {
		cfg := ctrConfig(strings.ReplaceAll(lc.name, " ", "-"), img, "sh", "-c", lc.script)
		id := e.runCtr(ctx, podID, pod, cfg)
		st := e.waitExit(ctx, id, 30*time.Second)
		var o, errb bytes.Buffer
		if err := logs.ReadLogs(ctx, st.GetLogPath(), id, &logs.LogOptions{}, nil, &o, &errb); err != nil {
			t.Fatalf("%s: kubelet's ReadLogs: %v", lc.name, err)
		}
		if o.String() != lc.stdout || errb.String() != lc.stderr {
			t.Errorf("%s: kubelet reads stdout %q stderr %q, want %q and %q", lc.name, trimForLog(o.String()), errb.String(), trimForLog(lc.stdout), lc.stderr)
		}
	}
}

func trimForLog(s string) string {
	if len(s) > 80 {
		return s[:40] + "…" + s[len(s)-40:]
	}
	return s
}

// TestE2ELogBytes: what a container writes is what kubelet reads from its CRI log,
// with crisp's shim writing the log.
func TestE2ELogBytes(t *testing.T) {
	e := newEnv(t)
	e.start()
	ctx := ctxT(t)
	img := e.busybox(ctx)
	pod := e.podConfig("logbytes")
	podID := e.runPod(ctx, pod)
	e.checkLogBytes(ctx, t, podID, pod, img)
	// ExecSync's output is the bytes as written: no CR dropped, no newline added.
	sleeper := e.runCtr(ctx, podID, pod, ctrConfig("sleeper", img, "sleep", "3600"))
	resp, err := e.execSync(ctx, sleeper, 10, "sh", "-c", `printf 'a\r\nb'; printf 'e\r' >&2`)
	if err != nil || string(resp.Stdout) != "a\r\nb" || string(resp.Stderr) != "e\r" {
		t.Errorf("ExecSync output %q %q (%v), want %q %q", resp.GetStdout(), resp.GetStderr(), err, "a\r\nb", "e\r")
	}
	e.stopRemove(ctx, t, podID)
	if logs, _ := filepath.Glob(filepath.Join(pod.LogDirectory, "*.log")); len(logs) != len(logCases)+1 {
		t.Errorf("%d log files, want %d", len(logs), len(logCases)+1)
	}
}

// TestE2ETaskShimLogBytes: the same with a task-only shim, criserver copying the
// output into the log.
func TestE2ETaskShimLogBytes(t *testing.T) {
	ts := taskShims[0]
	e, ctx, img := taskEnv(t, ts)
	pod := e.taskPod("tasklogbytes")
	podID := e.runTaskPod(ctx, t, pod)
	e.checkLogBytes(ctx, t, podID, pod, img)
	e.stopRemove(ctx, t, podID)
}
