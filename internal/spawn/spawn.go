package spawn

import (
	"os/exec"
	"runtime"
	"sync"
)

// request is one start for the spawn thread; done gets its outcome.
type request struct {
	start func() error
	done  chan<- outcome
}

// outcome is what a start returned, or the value it panicked with.
type outcome struct {
	err      error
	panicked bool
	value    any
}

// thread returns the channel of the spawn thread, starting it on first use. It is the
// package's one piece of process-wide state, on purpose: the thread is process-wide by
// nature (it must end only with the process), a second one would only cost a thread
// that can never be given back, and an owner that could stop it would kill the
// children it started. The channel never changes once made.
var thread = sync.OnceValue(func() chan<- request {
	reqs := make(chan request)
	go serve(reqs)
	return reqs
})

// serve runs the starts sent on reqs on its locked thread, forever: reqs is never
// closed, and returning would end the thread and signal every child started from it.
func serve(reqs <-chan request) {
	runtime.LockOSThread()
	for r := range reqs {
		r.done <- run(r.start)
	}
}

// run calls start and catches a panic, which would otherwise end the spawn thread
// with the goroutine; the caller panics with it instead.
func run(start func() error) (o outcome) {
	defer func() {
		if v := recover(); v != nil {
			o = outcome{panicked: true, value: v}
		}
	}()
	return outcome{err: start()}
}

// Do runs start on the spawn thread and returns its error. start must fork the child
// and return (exec.Cmd.Start, os.StartProcess, or a tracker's start that takes a lock
// for a moment around one): starts are run one at a time, so one that waits holds up
// every other; waiting for the child belongs to the caller, on any goroutine. start
// must not call Do. The child inherits the spawn thread's per-thread
// state (namespaces, credentials), which is the process's own, not the caller's.
func Do(start func() error) error {
	done := make(chan outcome, 1)
	thread() <- request{start: start, done: done}
	o := <-done
	if o.panicked {
		panic(o.value)
	}
	return o.err
}

// Start starts cmd on the spawn thread (exec.Cmd.Start).
func Start(cmd *exec.Cmd) error {
	return Do(cmd.Start)
}
