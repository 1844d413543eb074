// Package reaper owns the shim's role as child subreaper: it reaps orphaned descendants
// that the kernel re-parents to the shim. It must not reap a child the shim started itself
// through Start or StartFunc (nor their helpers), nor one an owner claimed; those belong
// to their owner's Wait. While a subscription is open it records the exits it reaps, for
// owners that learn a pid only after the process may have exited (Subscribe, Claim).
package reaper
