package spec

import (
	"strconv"
	"strings"
	"syscall"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Real-time signal bounds as user space sees them: glibc reserves 32 and 33, so
// SIGRTMIN is 34 (moby/sys/signal, used by containerd, agrees).
const (
	sigRTMin = 34
	sigRTMax = 64
)

// signalNames are the Linux signal names without "SIG", aliases included.
var signalNames = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT, "ALRM": syscall.SIGALRM, "BUS": syscall.SIGBUS,
	"CHLD": syscall.SIGCHLD, "CLD": syscall.SIGCHLD, "CONT": syscall.SIGCONT,
	"FPE": syscall.SIGFPE, "HUP": syscall.SIGHUP, "ILL": syscall.SIGILL,
	"INT": syscall.SIGINT, "IO": syscall.SIGIO, "IOT": syscall.SIGIOT,
	"KILL": syscall.SIGKILL, "PIPE": syscall.SIGPIPE, "POLL": syscall.SIGIO,
	"PROF": syscall.SIGPROF, "PWR": syscall.SIGPWR, "QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV, "STKFLT": syscall.SIGSTKFLT, "STOP": syscall.SIGSTOP,
	"SYS": syscall.SIGSYS, "TERM": syscall.SIGTERM, "TRAP": syscall.SIGTRAP,
	"TSTP": syscall.SIGTSTP, "TTIN": syscall.SIGTTIN, "TTOU": syscall.SIGTTOU,
	"URG": syscall.SIGURG, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2,
	"VTALRM": syscall.SIGVTALRM, "WINCH": syscall.SIGWINCH, "XCPU": syscall.SIGXCPU,
	"XFSZ":  syscall.SIGXFSZ,
	"RTMIN": sigRTMin, "RTMAX": sigRTMax,
}

// StopSignal is the signal StopContainer sends first: the CRI's stop_signal (KEP-4960,
// set by kubelet from the container's lifecycle.stopSignal), else the image's
// StopSignal, else SIGTERM — containerd's order. The stop signal is not part of the
// OCI spec; the caller keeps it with the container.
func StopSignal(cfg *runtime.ContainerConfig, img ocispec.Image) (syscall.Signal, error) {
	if s := cfg.GetStopSignal(); s != runtime.Signal_SIGNAL_RUNTIME_DEFAULT {
		name, ok := runtime.Signal_name[int32(s)]
		if !ok {
			return 0, invalidf("unknown CRI stop_signal %d", s)
		}
		// SIGNAL_SIGRTMINPLUS3 is SIGRTMIN+3 (containerd's convertFromCRISignal).
		name = strings.TrimPrefix(name, "SIGNAL_")
		name = strings.Replace(name, "PLUS", "+", 1)
		name = strings.Replace(name, "MINUS", "-", 1)
		sig, err := ParseSignal(name)
		if err != nil {
			return 0, invalidf("CRI stop_signal %s: %v", s, err)
		}
		return sig, nil
	}
	if img.Config.StopSignal != "" {
		sig, err := ParseSignal(img.Config.StopSignal)
		if err != nil {
			return 0, invalidf("the image's STOPSIGNAL %q: %v", img.Config.StopSignal, err)
		}
		return sig, nil
	}
	return syscall.SIGTERM, nil
}

// ParseSignal parses a signal as docker and containerd accept it: a name with or
// without "SIG" in any case ("SIGTERM", "term"), a number ("15"), or a real-time
// signal relative to its bounds ("SIGRTMIN+3", "RTMAX-1").
func ParseSignal(s string) (syscall.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > sigRTMax {
			return 0, invalidf("signal %d is out of range (1 to %d)", n, sigRTMax)
		}
		return syscall.Signal(n), nil
	}
	name := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "SIG")
	if sig, ok := signalNames[name]; ok {
		return sig, nil
	}
	for _, base := range []string{"RTMIN", "RTMAX"} {
		rest, ok := strings.CutPrefix(name, base)
		if !ok || len(rest) < 2 || (rest[0] != '+' && rest[0] != '-') {
			continue
		}
		off, err := strconv.Atoi(rest[1:])
		if err != nil || off < 0 {
			break
		}
		n := int(signalNames[base])
		if rest[0] == '+' {
			n += off
		} else {
			n -= off
		}
		if n < sigRTMin || n > sigRTMax {
			return 0, invalidf("signal %s is out of the real-time range", s)
		}
		return syscall.Signal(n), nil
	}
	return 0, invalidf("%q is not a signal name or number", s)
}
