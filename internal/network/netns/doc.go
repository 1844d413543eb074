// Package netns creates and removes the pinned network namespaces of pods.
// It owns only the pin directory's shared bind mount and the bind-mounted files in it.
// It must not configure pod networking beyond bringing lo up: interfaces, addresses and routes are CNI's.
package netns
