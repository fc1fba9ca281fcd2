// Package packaging checks the deployment artifacts of deploy/ with the
// tools that run without a container engine or a cluster (issue 16 §3):
//
//   - the release build (static, -trimpath, stripped, version stamped) of
//     the host target, and `lockd version` on it;
//   - deploy/systemd: `systemd-analyze verify` and `systemd-analyze security
//     --offline` on the unit, its hardening directives, and lockd started
//     with the example lockd.yaml;
//   - deploy/container/Containerfile: parsed with BuildKit's Dockerfile
//     parser (multi-stage, static build, non-root USER, VOLUME, HEALTHCHECK,
//     no ADD), and the final stage's ENTRYPOINT, CMD and ENV run as lockd
//     with its HEALTHCHECK command;
//   - deploy/helm/lockd: `helm lint --strict` and `helm template` (helm from
//     the `tool` line of this module's go.mod, a pinned version) for each
//     mode, every rendered manifest decoded strictly into its k8s.io/api
//     type, and the rendered container environment run as lockd.
//
// It is a module of its own so that helm and k8s.io/api never enter the
// lockd module's dependencies; `make package-check` runs it. The image is
// never built or run and the chart never installed: there is no container
// engine or cluster here.
package packaging
