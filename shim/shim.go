package shim

import (
	"strings"

	"github.com/crisp-runtime/crisp/pkg/shimkit/bootstrap"
)

// RuntimeName is what -info reports as the runtime's name.
const RuntimeName = "crisp-shim-runc"

// StartOptions are what crisp's shim adds to the kit's `start`: its serving
// environment (Environ).
func StartOptions() bootstrap.StartOptions {
	return bootstrap.StartOptions{Environ: Environ}
}

// criuFaultEnv is the environment variable CRIU reads its fault-injection mode from.
const criuFaultEnv = "CRIU_FAULT"

// criuNoBreakpoints is CRIU's FI_NO_BREAKPOINTS: CRIU stops the parasite it injects
// into a dumped process by stepping through its syscalls with PTRACE_SYSCALL instead of
// at a hardware breakpoint. VMs such as Firecracker give ptrace no working hardware
// breakpoints, and there every dump hangs after the parasite's last command (the stop
// on its rt_sigreturn never comes); the stepping costs a few milliseconds per dump.
const criuNoBreakpoints = "130"

// Environ is the serving shim's environment made from the one `start` runs with: one
// Go thread for Go code, CRIU's settings, and none of the variables the shim's pause
// re-execution reads (_CRISP_*). libcontainer runs `criu swrk` with the shim's
// environment (and a container's init with none of it), so CRIU's settings are given
// here, once per shim, rather than by changing the process environment later.
func Environ(environ []string) []string {
	set := map[string]string{"GOMAXPROCS": "1"}
	// An operator's own CRIU_FAULT (0 to use hardware breakpoints on bare metal) wins.
	if !hasEnv(environ, criuFaultEnv) {
		set[criuFaultEnv] = criuNoBreakpoints
	}
	kept := environ[:0:0]
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "_CRISP_") {
			kept = append(kept, kv)
		}
	}
	return bootstrap.SetEnv(kept, set)
}

// hasEnv reports whether environ sets key.
func hasEnv(environ []string, key string) bool {
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}
