// Separate module (not part of github.com/lockwarden/lockwarden): the tools
// `make release` and `make chart-readme` run. Their dependencies stay out of
// the main module's go.mod, which users of pkg/redislock inherit.
module github.com/lockwarden/lockwarden/hack/tools/release

go 1.26.0

require gopkg.in/yaml.v3 v3.0.1
