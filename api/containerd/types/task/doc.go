// Package task is a copy of containerd's generated code; see package containerd.
package task
