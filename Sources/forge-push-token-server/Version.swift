/// The service's version, printed by `--version` and stamped on the container image
/// (`docker/Dockerfile` reads this line; keep it a single string literal).
let serverVersion = "0.2.0"
