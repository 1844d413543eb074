// Package network attaches pods to the node's CNI network through libcni.
// It owns the CNI config choice (writing a default bridge config when there is none), ADD/DEL and the libcni result cache.
// Every ADD and DEL is bounded by Config.Timeout, which kills the plugin's whole process group (exec.go);
// a DEL that keeps failing is retried in the background from Config.PendingDir (pending.go).
// With Config.Masquerade = MasqueradeRuntime (cni.masquerade, the default) a bridge plugin's ipMasq is turned off in memory and crisp keeps one MASQUERADE rule per pod subnet in its own nat chain (masq.go, iptables.go);
// the rules outlive criserver, like the pods.
// It must not create or remove network namespaces (package netns does, and brings lo up, so no loopback plugin runs).
package network
