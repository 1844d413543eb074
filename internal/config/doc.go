// Package config owns criserver's settings: the TOML file format, its defaults and
// their validation. It reads and checks settings only; it must not create directories,
// sockets or any other state described by them.
package config
