// Package mount mounts and unmounts the mount lists snapshots hand out (overlay or
// bind) at a target directory. It must not decide what is mounted; callers do.
package mount
