//! Build information embedded at compile time by `build.rs`: version, git commit, build time.

/// The agent's version (`git describe --tags --always --dirty`, or the crate version).
pub const VERSION: &str = env!("AKS_FLEX_NODE_VERSION");
/// The short git commit, or `unknown`.
pub const GIT_COMMIT: &str = env!("AKS_FLEX_NODE_GIT_COMMIT");
/// UTC RFC 3339 build time, or `unknown`.
pub const BUILD_TIME: &str = env!("AKS_FLEX_NODE_BUILD_TIME");

/// The `version` command's four lines.
pub fn render() -> String {
    format!(
        "AKS Flex Node Agent\nVersion: {VERSION}\nGit Commit: {GIT_COMMIT}\nBuild Time: {BUILD_TIME}\n"
    )
}
