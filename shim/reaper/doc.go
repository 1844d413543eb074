// Package reaper owns the shim's role as child subreaper: it reaps orphaned descendants
// that the kernel re-parents to the shim. It must not reap a child the shim started itself
// through Start or StartFunc (nor their helpers); those belong to their owner's Wait.
package reaper
