// Package docs holds the checks of crisp's documentation: every relative link in
// README.md and docs/ leads somewhere, and the configuration reference and man page
// cover every config key. It has no code of its own and needs no root.
package docs
