// Package controller is crisp's sandbox controller: it starts one shim per pod through
// the runtime-v2 bootstrap, talks containerd's sandbox API to it over ttrpc, owns the
// pod's network namespace and CNI, and finds every shim again after a restart. It is the
// only package that speaks to shims; it must not know the CRI's types.
package controller
