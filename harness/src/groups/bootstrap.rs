//! The `bootstrap` host group: `bootstrap.env` is data (never evaluated), the machine image came
//! from the harness's password-protected registry with the credentials file the Ignition config
//! wrote, and `start` ran once and saved the state (a second start finds the node
//! bootstrapped). A second bootstrap with a
//! new config is the `reset` group's: it follows the reset that group checks, so the pass
//! resets and bootstraps once, not twice.

use std::time::Duration;

use crate::check::{Ctx, Group, HostMode, Needs, check, ensure};
use crate::kit::agent::{T, write_bootstrap_env};
use crate::provision::{PWNED_MARKER, hostile_location};
use crate::registry::{AUTH_USER, GUEST_AUTH_FILE, authorized_requests};
use crate::report::{Checked, Outcome};

/// The `bootstrap` group.
pub const GROUP: Group = Group {
    name: "bootstrap",
    description: "bootstrap.env is data; start runs once and saves state",
    needs: Needs::Host,
    checks: &[
        check!("bootstrap.env is data", bootstrap_env_is_data),
        check!(
            "the machine image was pulled from a registry that asks for a password",
            machine_image_pulled_with_a_password
        ),
        check!("start ran once and saved the state", start_ran_once),
    ],
    in_host_mode: HostMode::Same,
};

async fn bootstrap_env_is_data(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    let evaluated = c.output(&format!("test -e {PWNED_MARKER}"), T).await?;
    ensure(!evaluated.success(), || {
        format!("{PWNED_MARKER} exists: bootstrap.env was evaluated")
    })?;
    let cfg = c.agent_config().await?;
    let loc = cfg.azure.target_cluster.location;
    ensure(loc == hostile_location(), || {
        format!("location in config.json is {loc:?}")
    })?;
    Ok(Outcome::Passed)
}

/// The guest's machine image is on the harness's password-protected registry
/// (`crate::registry::start_auth`), which refuses it anonymously (asked here with the agent's
/// registry client); the agent's config names the credentials file, which the Ignition config
/// wrote 0600; and that registry's log shows the manifest requests it let through, which only
/// the password opens.
async fn machine_image_pulled_with_a_password(c: &Ctx<'_>) -> anyhow::Result<Checked> {
    let Some(reg) = &c.state.registry else {
        anyhow::bail!("the state names no registry");
    };
    let (Some(auth), Some(guest_auth)) = (&reg.auth, reg.guest_auth_addr()) else {
        return Ok(Checked::from(Outcome::Skipped(
            "this VM's registry has no password-protected instance (an `up` from before it)".into(),
        )));
    };
    let image = c.state.machine_image.clone().unwrap_or_default();
    ensure(image.starts_with(&format!("{guest_auth}/")), || {
        format!(
            "the machine image {image:?} is not on the password-protected registry {guest_auth}"
        )
    })?;
    let cfg = c.agent_config().await?;
    let file = cfg
        .bootstrap
        .registry_auth
        .map(|a| a.config_file)
        .unwrap_or_default();
    ensure(file == GUEST_AUTH_FILE, || {
        format!("config.json's bootstrap.registryAuth.configFile is {file:?}")
    })?;
    let mode = c.sh(&format!("stat -c %a {GUEST_AUTH_FILE}")).await?;
    ensure(mode.trim() == "600", || {
        format!("{GUEST_AUTH_FILE} has mode {}", mode.trim())
    })?;
    // Anonymous: refused, naming the registry.
    let host_addr = format!("127.0.0.1:{}", auth.port);
    let on_host = image.replacen(&guest_auth, &host_addr, 1);
    let reference = flex_oci::ImageRef::parse(&on_host)?;
    let anonymous = flex_oci::RegistryClient::new(flex_host::http::client()?)
        .with_insecure_registries(flex_host::http::InsecureRegistries::parse(
            "harness", &host_addr,
        )?)
        .resolve(&reference, flex_oci::Arch::host())
        .await;
    let refusal = match anonymous {
        Ok(_) => anyhow::bail!("{on_host} was served without a password"),
        Err(e) => e.to_string(),
    };
    ensure(refusal.contains("wants credentials"), || {
        format!("asked anonymously: {refusal}")
    })?;
    let log = std::fs::read_to_string(reg.auth_log())?;
    let let_through = authorized_requests(&log, "/v2/aks-flex/machine/manifests/");
    ensure(let_through >= 1, || {
        format!(
            "{} shows no machine manifest request let through",
            reg.auth_log().display()
        )
    })?;
    Ok(Checked::passed_with(format!(
        "{let_through} machine manifest request(s) let through with {AUTH_USER}'s password; refused anonymously"
    )))
}

async fn start_ran_once(c: &Ctx<'_>) -> anyhow::Result<Outcome> {
    // One file per record (its checksum inside, no `.sha256` sidecar), and the bootstrap
    // marked complete last.
    c.sh("test -s /etc/aks-flex-node/daemon-state.json && ! test -e /etc/aks-flex-node/daemon-state.json.sha256 && test -s /etc/aks-flex-node/bootstrap-complete.json")
        .await?;
    let count = || async {
        c.sh("journalctl -u aks-flex-node-bootstrap.service -o cat | grep -c 'AKS Flex Node agent service started successfully' || true")
            .await
    };
    let before: u32 = count().await?.parse().unwrap_or(0);
    ensure(before == 1, || {
        format!("start reported success {before} times")
    })?;
    // The first-boot unit removed the file that carried the token once the bootstrap succeeded
    // (the drop-in `aks-flex-node ignition` and the harness's config add).
    let kept = c
        .output("test -e /etc/aks-flex-node/bootstrap.env", T)
        .await?;
    ensure(!kept.success(), || {
        "/etc/aks-flex-node/bootstrap.env (it carries the token) is still there after the bootstrap"
            .into()
    })?;
    // Inputs again, so the unit runs (its condition) and must find the node bootstrapped.
    let env = c.state.bootstrap_env.clone().unwrap_or_default();
    write_bootstrap_env(c, &env).await?;
    c.sh_t(
        "systemctl restart aks-flex-node-bootstrap.service",
        Duration::from_secs(300),
    )
    .await?;
    let after: u32 = count().await?.parse().unwrap_or(0);
    ensure(after == 1, || {
        format!("a second bootstrap ran start again ({after} successes)")
    })?;
    Ok(Outcome::Passed)
}
