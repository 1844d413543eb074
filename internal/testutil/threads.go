package testutil

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// EndThreads keeps making the Go runtime end OS threads until the test ends or the
// returned stop is called: goroutines lock their thread and return without unlocking,
// as crisp's namespace and idmap code does on its error paths, so the runtime
// terminates each such thread. Any idle thread may be the next one taken, which is how
// a child started with Pdeathsig from an ordinary goroutine gets its signal early.
func EndThreads(t testing.TB) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				runtime.LockOSThread()
			}()
			<-ended
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(done); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}
