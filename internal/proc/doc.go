// Package proc owns how crisp names processes it did not start in this life: pid plus
// start time from /proc, verified before any signal, and oom_score_adj. It must not
// signal a pid whose start time it has not just checked (recycled pids are someone else's).
package proc
