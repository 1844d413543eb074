// Package version holds crisp's version, set at link time by the Makefile.
package version

// Version is crisp's release version; "dev" for builds outside the Makefile.
var Version = "dev"

// Name is the runtime name reported over the CRI and the shim's -info.
const Name = "crisp"
