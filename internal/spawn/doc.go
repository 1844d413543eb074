// Package spawn starts child processes that must die with crisp's process (Pdeathsig)
// from one OS thread that lives as long as the process. It owns that thread and nothing
// else: it does not wait for, track or signal the children it starts.
//
// Linux sends the parent-death signal when the thread that forked the child exits, not
// when its process does (prctl(2), PR_SET_PDEATHSIG: the parent "is considered to be
// the thread that created this process"; https://go.dev/issue/27505). A goroutine may
// fork on any of the runtime's threads, and the runtime ends a thread whenever a
// goroutine that locked it returns without unlocking it, which crisp's network
// namespace and idmapped-mount code does on purpose so that a thread left in a
// namespace or with other ids is never reused. Any later fork could land on such a
// thread before it is locked, and its child would be killed while crisp still uses it.
//
// So every start whose child has a Pdeathsig runs on the spawn thread: a goroutine that
// locks its thread and never returns, so only it ever runs there and the thread ends
// only with the process. Its children then get their signal exactly when crisp dies.
// The other fix, no Pdeathsig and an explicit kill on every path, cannot cover crisp
// being SIGKILLed or crashing, which is what Pdeathsig is there for.
package spawn
