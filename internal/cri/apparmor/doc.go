// Package apparmor owns crisp's use of the host's AppArmor: whether the host enforces
// it, crisp's default container profile (generated from containerd's maintained
// template and loaded with apparmor_parser), and which profiles are loaded. It knows
// nothing of the CRI: internal/cri/spec decides which container gets which profile.
package apparmor
