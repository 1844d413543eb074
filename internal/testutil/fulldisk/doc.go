// Package fulldisk holds helpers for tests that run a filesystem out of space: small
// tmpfs mounts, resizing them, filling them up and watching their free space.
// It is imported only by tests.
package fulldisk
