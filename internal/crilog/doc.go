// Package crilog owns the CRI container log format: it turns a container's stdout and
// stderr into "<RFC3339Nano> <stream> <F|P> <text>" lines in one file and reopens it.
// It must not read pipes or know about containers; callers feed it bytes.
package crilog
