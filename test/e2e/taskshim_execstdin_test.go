package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/remotecommand"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// execStdinRounds is how many stdin-fed execs TestE2ETaskShimExecStdin runs: the
// race it guards against (criserver closing stdin before the shim's reader of the
// FIFO is open, containerd's shims open it in a goroutine after Start returned) is
// narrow, so one exec rarely shows it.
const execStdinRounds = 20

// Execs fed on stdin through the streaming server, one after another, each given its
// input and its EOF: none may lose the input or hang waiting for EOF.
func TestE2ETaskShimExecStdin(t *testing.T) {
	for _, ts := range taskShims {
		t.Run(ts.name, func(t *testing.T) {
			e, ctx, img := taskEnv(t, ts)
			pod := e.taskPod("execstdin")
			podID := e.runTaskPod(ctx, t, pod)
			_, info := e.status(ctx, podID)
			sleeper := e.runCtr(ctx, podID, pod, ctrConfig("sleeper", img, "sleep", "1000"))
			failed := 0
			for i := range execStdinRounds {
				want := strings.Repeat("fed ", i) + "end\n"
				var out bytes.Buffer
				url := e.execURL(ctx, t, &cri.ExecRequest{ContainerId: sleeper, Cmd: []string{"cat"}, Stdin: true, Stdout: true})
				sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				err := stream(sctx, t, url, spdyTransport, remotecommand.StreamOptions{Stdin: strings.NewReader(want), Stdout: &out})
				cancel()
				if err != nil || out.String() != want {
					failed++
					t.Errorf("round %d: exec cat with stdin: %q %v, want %q", i, out.String(), err, want)
				}
			}
			if failed > 0 {
				t.Logf("%d of %d stdin-fed execs failed", failed, execStdinRounds)
			}
			e.stopRemove(ctx, t, podID)
			e.assertPodGone(t, podID, info)
			e.assertTaskShimClean(t)
		})
	}
}
