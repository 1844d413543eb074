// Package wasm is crisp's second sandboxer: it runs the containers of a pod as WASI
// preview 1 modules with wazero (pure Go), built on the sandboxer kit pkg/shimkit.
// It must not import shim/, controller, internal/cri or libcontainer.
package wasm
