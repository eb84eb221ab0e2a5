//! What the agent writes for a node machine: files inside its root file system (containerd,
//! kubelet and its kubeconfig, kernel module and sysctl files, the hostname, resolv.conf and
//! the units masked in a machine) and on the host (the `.nspawn` settings and the unit
//! drop-in). Rendering is pure ([`render_rootfs`], [`render_host`]); [`apply`] writes the result
//! atomically, only where the content changed: host files through [`HostFs`], files inside the
//! machine through [`ConfinedFs`], so the image's symlinks never lead a write onto the host.
//!
//! Choices where unbounded versions disagree (also in ARCHITECTURE.md): devices are bound one by
//! one with a `DeviceAllow=` each (not the whole `/dev`); the pre-start hook runs from the
//! drop-in's `ExecStartPre=` rather than a separate regeneration unit; containerd's config is
//! version 2 (containerd 2.x migrates it on load).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config;
use crate::machine::kubelet_credential;
use crate::machine::nodegoal::{
    AGENT_IN_ROOTFS, AKS_AAD_SERVER_ID, KubeletAuth, MachineGoal, SP_CLIENT_SECRET_ENV,
    SP_CLIENT_SECRET_FILE_ENV, SP_SECRET_IN_ROOTFS,
};
use crate::machine::nspawn::{bpffs_dir, dropin_dir, machine_dir, nspawn_file};
use flex_host::fs::{ConfinedFs, FsError, HostFs};
use flex_host::secret::Secret;

/// Host path of the lifecycle helper: a copy of the agent binary that host systemd runs as
/// `nspawn-lifecycle pre-start|post-start <m>`. It is a copy, not a link, so an agent upgrade
/// cannot break units already written.
pub const LIFECYCLE_HELPER: &str = "/usr/local/bin/aks-flex-node-nspawn-lifecycle";

/// kubelet's CA file inside the machine.
pub const KUBELET_CA: &str = "/etc/kubernetes/pki/apiserver-client-ca.crt";

const TLS_CIPHER_SUITES: &str = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_RSA_WITH_AES_256_GCM_SHA384,TLS_RSA_WITH_AES_128_GCM_SHA256";

/// One thing to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A file with content and mode.
    File {
        /// Host path.
        path: PathBuf,
        /// Content.
        content: Vec<u8>,
        /// Mode.
        mode: u32,
    },
    /// A symlink.
    Symlink {
        /// Host path.
        path: PathBuf,
        /// Link target.
        target: PathBuf,
    },
    /// A directory with a mode.
    Dir {
        /// Host path.
        path: PathBuf,
        /// Mode.
        mode: u32,
    },
}

impl Entry {
    /// The entry's host path.
    pub fn path(&self) -> &Path {
        match self {
            Entry::File { path, .. } | Entry::Symlink { path, .. } | Entry::Dir { path, .. } => {
                path
            }
        }
    }
}

fn file(root: &Path, rel: &str, content: impl Into<Vec<u8>>, mode: u32) -> Entry {
    Entry::File {
        path: root.join(rel.trim_start_matches('/')),
        content: content.into(),
        mode,
    }
}

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// `caCertData` is not valid base64.
    #[error("machine {machine}: node.kubelet.caCertData is not valid base64: {reason}")]
    BadCa {
        /// Machine.
        machine: String,
        /// Why it does not decode.
        reason: Base64Error,
    },
    /// A value of the goal is not valid for kubelet's flags (the config's validation, run
    /// again here because the drop-in's arguments are word-split by systemd).
    #[error("machine {machine}: {field}: {message}")]
    Invalid {
        /// Machine.
        machine: String,
        /// The config field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A file could not be written.
    #[error("machine {machine}: {cause}")]
    Fs {
        /// Machine.
        machine: String,
        /// The error (in the message, not a `source()`: a chain printer would repeat it).
        cause: FsError,
    },
}

/// Everything written inside the machine's root file system. `host_resolv_conf` is the
/// host's `/etc/resolv.conf` content (the machine shares the host's network).
pub fn render_rootfs(
    goal: &MachineGoal,
    host_resolv_conf: &[u8],
) -> Result<Vec<Entry>, RenderError> {
    let root = goal.machine_dir();
    let ca = decode_base64(&goal.ca_cert_base64).map_err(|reason| RenderError::BadCa {
        machine: goal.machine.clone(),
        reason,
    })?;
    let mut out: Vec<Entry> = goal
        .registry_mirrors
        .iter()
        .map(|(registry, mirror)| {
            file(
                &root,
                &format!("etc/containerd/certs.d/{registry}/hosts.toml"),
                render_hosts_toml(registry, mirror),
                0o644,
            )
        })
        .collect();
    out.extend([
        file(
            &root,
            "etc/containerd/config.toml",
            render_containerd_config(goal),
            0o644,
        ),
        file(
            &root,
            "etc/systemd/system/containerd.service",
            CONTAINERD_UNIT,
            0o644,
        ),
        Entry::Dir {
            path: root.join("etc/kubernetes/manifests"),
            mode: 0o700,
        },
        file(&root, KUBELET_CA, ca, 0o644),
        file(
            &root,
            "etc/systemd/system/kubelet.service",
            render_kubelet_unit(),
            0o644,
        ),
        file(
            &root,
            "etc/systemd/system/kubelet.service.d/10-kubeconfig.conf",
            render_kubeconfig_dropin(goal),
            0o644,
        ),
        file(
            &root,
            "etc/systemd/system/kubelet.service.d/20-node-config.conf",
            render_node_config_dropin(goal)?,
            0o644,
        ),
        file(
            &root,
            "etc/systemd/system/kubelet.service.d/30-tuning.conf",
            render_tuning_dropin(goal),
            0o644,
        ),
        file(
            &root,
            "etc/systemd/system/kubelet.service.d/40-image-credential-provider.conf",
            render_credential_provider_dropin(goal),
            0o644,
        ),
        file(
            &root,
            crate::machine::components::NPD_UNIT,
            render_npd_unit(goal),
            0o644,
        ),
        file(
            &root,
            "etc/systemd/system/kubelet.service.d/50-env-file.conf",
            "[Service]\nEnvironmentFile=-/etc/default/kubelet\n",
            0o644,
        ),
    ]);
    let (kubeconfig_path, kubeconfig) = render_kubeconfig(goal);
    out.push(file(&root, kubeconfig_path, kubeconfig, 0o600));
    if let Some(config) = render_credential_provider_config(goal) {
        // 0600: the plugin's environment names the identity (the secret is in its own file).
        out.push(file(&root, CREDENTIAL_PROVIDER_CONFIG, config, 0o600));
    }
    if let Some(secret) = sp_secret(goal) {
        let dir = Path::new(SP_SECRET_IN_ROOTFS)
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
        out.push(Entry::Dir {
            path: root.join(dir.strip_prefix("/").unwrap_or(&dir)),
            mode: 0o700,
        });
        out.push(file(
            &root,
            SP_SECRET_IN_ROOTFS,
            secret.expose().as_bytes().to_vec(),
            0o600,
        ));
    }
    out.push(file(
        &root,
        "etc/tmpfiles.d/kmsg.conf",
        "L /dev/kmsg - - - - /dev/console\n",
        0o644,
    ));
    out.push(file(
        &root,
        "etc/modules-load.d/kubernetes.conf",
        "overlay\nbr_netfilter\n",
        0o644,
    ));
    out.push(file(
        &root,
        "etc/sysctl.d/99-kubernetes.conf",
        "# Written by aks-flex-node. Only net.* is writable inside the machine; the host sets the rest.\nnet.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\nnet.bridge.bridge-nf-call-ip6tables = 1\n",
        0o644,
    ));
    out.push(file(
        &root,
        "etc/hostname",
        format!("{}\n", goal.hostname),
        0o644,
    ));
    out.push(file(
        &root,
        "etc/resolv.conf",
        host_resolv_conf.to_vec(),
        0o644,
    ));
    for unit in [
        "systemd-resolved.service",
        "systemd-udevd.service",
        "systemd-udevd-control.socket",
        "systemd-udevd-kernel.socket",
    ] {
        out.push(Entry::Symlink {
            path: root.join("etc/systemd/system").join(unit),
            target: PathBuf::from("/dev/null"),
        });
    }
    Ok(out)
}

/// The host-side files: `.nspawn` settings and the unit drop-in.
pub fn render_host(goal: &MachineGoal) -> Vec<Entry> {
    vec![
        Entry::File {
            path: nspawn_file(&goal.machine),
            content: render_nspawn(goal).into_bytes(),
            mode: 0o644,
        },
        Entry::File {
            path: dropin_dir(&goal.machine).join("override.conf"),
            content: render_override(goal).into_bytes(),
            mode: 0o644,
        },
    ]
}

/// `/etc/systemd/nspawn/<m>.nspawn`: all capabilities, no user namespace, the host's network,
/// the host's kernel modules read-only, the machine's own bpffs, and the host devices it gets.
pub fn render_nspawn(goal: &MachineGoal) -> String {
    let mut s = String::from(
        "[Exec]\nCapability=all\nPrivateUsers=no\nSystemCallFilter=@keyring bpf perf_event_open\n\n[Network]\nVirtualEthernet=no\n\n[Files]\nBindReadOnly=/lib/modules\n",
    );
    let _ = writeln!(s, "Bind={}:/sys/fs/bpf", bpffs_dir(&goal.machine).display());
    for d in &goal.devices.paths {
        let _ = writeln!(s, "Bind={d}");
    }
    s
}

/// `systemd-nspawn@<m>.service.d/override.conf`.
pub fn render_override(goal: &MachineGoal) -> String {
    let m = &goal.machine;
    let bpffs = bpffs_dir(m).display().to_string();
    let mut s = String::new();
    let _ = write!(
        s,
        "[Unit]\nStartLimitIntervalSec=0\n\n[Service]\nRestart=on-failure\nRestartSec=10s\n\
ExecStartPre=-/usr/bin/machinectl terminate {m}\n\
ExecStartPre=/usr/bin/mkdir -p {bpffs}\n\
ExecStartPre=/bin/sh -c '/usr/bin/mountpoint -q {bpffs} || /usr/bin/mount -t bpf bpf {bpffs}'\n\
ExecStartPre={LIFECYCLE_HELPER} nspawn-lifecycle pre-start {m}\n\
ExecStartPost={LIFECYCLE_HELPER} nspawn-lifecycle post-start {m}\n\
Environment=SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1\n\
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network\n\n\
DeviceAllow=char-ipvtap rwm\nDeviceAllow=char-macvtap rwm\n"
    );
    for d in goal.devices.paths.iter().chain(&goal.devices.groups) {
        let _ = writeln!(s, "DeviceAllow={d} rwm");
    }
    s
}

/// `s` as a TOML basic string, quotes included: `"` and `\` escaped and every control
/// character as `\uXXXX` (TOML 1.0, "String"), so a value stays one string whatever it holds.
/// The TOML files the agent writes are fixed text with every value from the config or the goal
/// put in through this (the config's checks refuse such values first; this is the second line).
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// containerd's `hosts.toml` for `registry`: pull and resolve through `mirror` first, then the
/// registry itself (`server`).
pub fn render_hosts_toml(registry: &str, mirror: &str) -> String {
    format!(
        "# Written by aks-flex-node: node.registryMirrors.\nserver = {}\n\n[host.{}]\n  capabilities = [\"pull\", \"resolve\"]\n",
        toml_string(&format!("https://{registry}")),
        toml_string(mirror)
    )
}

/// containerd's config (version 2).
pub fn render_containerd_config(goal: &MachineGoal) -> String {
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        r#"version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
oom_score = 0

[{cri}]
  sandbox_image = {sandbox}
  image_pull_progress_timeout = "30m"

[{cri}.containerd]
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  BinaryName = "/usr/local/bin/runc"
  NoNewKeyring = true
  SystemdCgroup = true

[{cri}.containerd.runtimes.untrusted]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.untrusted.options]
  BinaryName = "/usr/local/bin/runc"

[{cri}.cni]
  bin_dir = "/opt/cni/bin"
  conf_dir = "/etc/cni/net.d"

[{cri}.registry]
  config_path = "/etc/containerd/certs.d"

[{cri}.registry.headers]
  X-Meta-Source-Client = ["aks-flex-node/kubelet"]

[plugins."io.containerd.transfer.v1.local"]
  max_concurrent_downloads = 6

[metrics]
  address = "0.0.0.0:10257"
"#,
        sandbox = toml_string(&goal.sandbox_image)
    )
}

const CONTAINERD_UNIT: &str = "[Unit]
Description=containerd container runtime
After=network.target local-fs.target

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=1
RestartMaxDelaySec=60
RestartSteps=10
LimitNPROC=infinity
LimitCORE=infinity
LimitNOFILE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
";

/// kubelet's unit inside the machine.
pub fn render_kubelet_unit() -> String {
    let flags = [
        "--enable-server",
        "--volume-plugin-dir=/etc/kubernetes/volumeplugins",
        "--pod-manifest-path=/etc/kubernetes/manifests/",
        "--runtime-request-timeout=15m",
        "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
        "--address=0.0.0.0",
        "--anonymous-auth=false",
        "--authentication-token-webhook=true",
        "--authorization-mode=Webhook",
        "--cgroup-driver=systemd",
        "--cgroups-per-qos=true",
        "--enforce-node-allocatable=pods",
        "--cluster-domain=cluster.local",
        "--event-qps=0",
        "--node-status-update-frequency=10s",
        "--pod-max-pids=-1",
        "--protect-kernel-defaults=true",
        "--read-only-port=0",
        "--resolv-conf=/etc/resolv.conf",
        "--streaming-connection-idle-timeout=4h",
    ];
    let mut s = String::from(
        "[Unit]\nDescription=kubelet: The Kubernetes Node Agent\nConditionPathExists=/usr/local/bin/kubelet\nWants=network-online.target containerd.service\nAfter=network-online.target containerd.service\n\n[Service]\nRestart=always\nRestartSec=1\nRestartMaxDelaySec=60\nRestartSteps=10\nSuccessExitStatus=143\nExecStart=/usr/local/bin/kubelet \\\n",
    );
    for f in flags {
        let _ = writeln!(s, "  {f} \\");
    }
    let _ = writeln!(s, "  --tls-cipher-suites={TLS_CIPHER_SUITES} \\");
    s.push_str("  $KUBELET_NODE_CONFIG_ARGS $KUBELET_TUNING_ARGS $KUBELET_KUBECONFIG_ARGS $KUBELET_IMAGE_CREDENTIAL_PROVIDER_ARGS $KUBELET_EXTRA_ARGS\n\n[Install]\nWantedBy=multi-user.target\n");
    s
}

/// kubelet's image credential provider config inside the machine.
pub const CREDENTIAL_PROVIDER_CONFIG: &str = "/etc/kubernetes/image-credential-provider.yaml";

/// The registries `token acr` serves by their name (kubelet's `matchImages` patterns).
pub const ACR_MATCH_IMAGES: [&str; 3] = ["*.azurecr.io", "*.azurecr.cn", "*.azurecr.us"];

/// kubelet's flags for its image credential provider: the config and the directory holding
/// `aks-flex-node` (the plugin), or nothing when the node has no Azure identity. Written in
/// every case, so a goal that drops the identity drops the flags.
fn render_credential_provider_dropin(goal: &MachineGoal) -> String {
    let args = match goal.acr_provider {
        Some(_) => format!(
            "--image-credential-provider-config={CREDENTIAL_PROVIDER_CONFIG} --image-credential-provider-bin-dir={}",
            Path::new(AGENT_IN_ROOTFS)
                .parent()
                .map_or_else(|| "/usr/local/bin".into(), |p| p.display().to_string())
        ),
        None => String::new(),
    };
    format!(
        "[Service]\n{}",
        environment("KUBELET_IMAGE_CREDENTIAL_PROVIDER_ARGS", &args)
    )
}

/// kubelet's `CredentialProviderConfig` (`kubelet.config.k8s.io/v1`): `aks-flex-node token acr`
/// for the ACR names and the config's other ACR registries, with the exec credential's
/// environment; `None` without an Azure identity.
pub fn render_credential_provider_config(goal: &MachineGoal) -> Option<String> {
    let p = goal.acr_provider.as_ref()?;
    let name = Path::new(AGENT_IN_ROOTFS).file_name().map_or_else(
        || "aks-flex-node".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    let mut s = format!(
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: {}\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n  defaultCacheDuration: 10m\n  matchImages:\n",
        yaml_str(&name)
    );
    for m in ACR_MATCH_IMAGES
        .iter()
        .map(|m| m.to_string())
        .chain(p.registries.iter().cloned())
    {
        let _ = writeln!(s, "  - {}", yaml_str(&m));
    }
    s.push_str("  args:\n  - token\n  - acr\n");
    if !p.resource_manager_endpoint.is_empty() {
        let _ = writeln!(
            s,
            "  - --resource-manager-endpoint\n  - {}",
            yaml_str(&p.resource_manager_endpoint)
        );
    }
    for r in &p.registries {
        let _ = writeln!(s, "  - --registry\n  - {}", yaml_str(r));
    }
    s.push_str("  env:\n");
    for (k, v) in &in_machine(&p.env) {
        let _ = writeln!(s, "  - name: {k}\n    value: {}", yaml_str(v.expose()));
    }
    Some(s)
}

/// An exec credential environment as a machine's files carry it: the service principal's
/// secret replaced by the path of the machine's file that holds it ([`SP_SECRET_IN_ROOTFS`]).
fn in_machine(env: &BTreeMap<String, Secret>) -> BTreeMap<String, Secret> {
    let mut out = env.clone();
    if out.remove(SP_CLIENT_SECRET_ENV).is_some() {
        out.insert(
            SP_CLIENT_SECRET_FILE_ENV.into(),
            Secret::new(SP_SECRET_IN_ROOTFS),
        );
    }
    out
}

/// The service principal's secret of `goal`'s Azure identity (kubelet's exec credential or the
/// image credential provider), if it has one.
fn sp_secret(goal: &MachineGoal) -> Option<&Secret> {
    let exec = match &goal.auth {
        KubeletAuth::ExecCredential { env } => env.get(SP_CLIENT_SECRET_ENV),
        KubeletAuth::BootstrapToken(_) => None,
    };
    exec.or_else(|| {
        goal.acr_provider
            .as_ref()
            .and_then(|p| p.env.get(SP_CLIENT_SECRET_ENV))
    })
}

fn render_kubeconfig_dropin(goal: &MachineGoal) -> String {
    let args = match goal.auth {
        KubeletAuth::BootstrapToken(_) => {
            "--bootstrap-kubeconfig=/var/lib/kubelet/bootstrap-kubeconfig --kubeconfig=/var/lib/kubelet/kubeconfig --rotate-certificates=true"
        }
        KubeletAuth::ExecCredential { .. } => {
            "--kubeconfig=/var/lib/kubelet/kubeconfig --rotate-certificates=true"
        }
    };
    format!(
        "[Service]\n{}",
        environment("KUBELET_KUBECONFIG_ARGS", args)
    )
}

/// Checks the goal's values that become kubelet flags with the config's own validation: they
/// are joined into one variable that `ExecStart=` word-splits, so quoting alone could not stop
/// a blank in a value from adding a flag.
fn check_node_values(goal: &MachineGoal) -> Result<(), RenderError> {
    let invalid = |field: String, message: &dyn std::fmt::Display| RenderError::Invalid {
        machine: goal.machine.clone(),
        field,
        message: message.to_string(),
    };
    for (k, v) in &goal.labels {
        let field = || format!("node.labels[{}]", config::shown(k));
        config::check_label_key(k).map_err(|m| invalid(field(), &m))?;
        config::check_label_value(v).map_err(|m| invalid(field(), &m))?;
    }
    for (i, t) in goal.taints.iter().enumerate() {
        config::check_taint(t).map_err(|m| invalid(format!("node.taints[{i}]"), &m))?;
    }
    config::check_ip(&goal.cluster_dns)
        .map_err(|m| invalid("networking.dnsServiceIP".into(), &m))?;
    if !goal.node_ip.is_empty() {
        config::check_ip(&goal.node_ip).map_err(|m| invalid("node.kubelet.nodeIP".into(), &m))?;
    }
    if !config::is_dns1123_subdomain(&goal.node_name) {
        return Err(invalid(
            "agent.nodeName".into(),
            &format!(
                "{} is not a valid Kubernetes node name",
                config::shown(&goal.node_name)
            ),
        ));
    }
    Ok(())
}

fn render_node_config_dropin(goal: &MachineGoal) -> Result<String, RenderError> {
    check_node_values(goal)?;
    let labels: Vec<String> = goal
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut args = format!("--node-labels={}", labels.join(","));
    if !goal.taints.is_empty() {
        let _ = write!(args, " --register-with-taints={}", goal.taints.join(","));
    }
    let _ = write!(
        args,
        " --client-ca-file={KUBELET_CA} --cluster-dns={} --hostname-override={}",
        goal.cluster_dns, goal.node_name
    );
    if !goal.node_ip.is_empty() {
        let _ = write!(args, " --node-ip={}", goal.node_ip);
    }
    Ok(format!(
        "[Service]\n{}",
        environment("KUBELET_NODE_CONFIG_ARGS", &args)
    ))
}

/// node-problem-detector's unit, as upstream's: it reports as the node through kubelet's
/// kubeconfig, its kernel monitor reading the machine's journal. The node name and API server
/// are quoted `Environment=` values each passed as one word (`${...}`). Written whether or not
/// the binary is installed; it is started only when it is (`nspawn::start_npd`).
fn render_npd_unit(goal: &MachineGoal) -> String {
    format!(
        "[Unit]\nDescription=Node Problem Detector\nAfter=network.target kubelet.service\n\n[Service]\n{}{}ExecStart=/{} --hostname-override=${{NPD_NODE_NAME}} --apiserver-override=${{NPD_APISERVER}} --config.system-log-monitor=/{}\nRestart=on-failure\nRestartSec=5s\n\n[Install]\nWantedBy=multi-user.target\n",
        environment("NPD_NODE_NAME", &goal.node_name),
        environment(
            "NPD_APISERVER",
            &format!(
                "{}?inClusterConfig=false&auth=/var/lib/kubelet/kubeconfig",
                goal.api_server
            )
        ),
        crate::machine::components::NPD_BIN,
        crate::machine::components::NPD_KERNEL_MONITOR,
    )
}

/// One `Environment="NAME=value"` line, quoted as systemd.syntax(7) reads it, whatever the
/// value: inside the double quotes `\` and `"` are backslash-escaped, line breaks and other
/// control characters are C escapes (`\n`, `\r`, `\t`, `\xNN`), and `%` is `%%` (no
/// specifier expansion). `$` needs nothing: `Environment=` does not expand variables. The
/// result is always one line that sets exactly `NAME` to `value`.
fn environment(name: &str, value: &str) -> String {
    let mut s = format!("Environment=\"{name}=");
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '%' => s.push_str("%%"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if c.is_ascii_control() => {
                let _ = write!(s, "\\x{:02x}", u32::from(c));
            }
            c if c.is_control() => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push_str("\"\n");
    s
}

fn render_tuning_dropin(goal: &MachineGoal) -> String {
    format!(
        "[Service]\n{}",
        environment(
            "KUBELET_TUNING_ARGS",
            &format!(
                "--max-pods={} --v={} --image-gc-high-threshold={} --image-gc-low-threshold={}",
                goal.max_pods, goal.verbosity, goal.image_gc.0, goal.image_gc.1
            )
        )
    )
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// kubelet's kubeconfig: `(path inside the machine, content)`. A bootstrap token gives
/// `/var/lib/kubelet/bootstrap-kubeconfig` (TLS bootstrap then writes the real kubeconfig); an
/// exec credential gives `/var/lib/kubelet/kubeconfig`. Mode 0600: it holds the credential.
pub fn render_kubeconfig(goal: &MachineGoal) -> (&'static str, String) {
    let mut s = kubeconfig_head(goal);
    match &goal.auth {
        KubeletAuth::BootstrapToken(t) => {
            let _ = writeln!(s, "    token: {}", yaml_str(t.expose()));
            (kubelet_credential::BOOTSTRAP_KUBECONFIG, s)
        }
        KubeletAuth::ExecCredential { env } => {
            let _ = write!(
                s,
                "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: {AGENT_IN_ROOTFS}\n      args:\n      - token\n      - kubelogin\n      - --server-id\n      - {AKS_AAD_SERVER_ID}\n      env:\n"
            );
            for (k, v) in &in_machine(env) {
                let _ = write!(
                    s,
                    "      - name: {k}\n        value: {}\n",
                    yaml_str(v.expose())
                );
            }
            s.push_str("      interactiveMode: Never\n      provideClusterInfo: false\n");
            (kubelet_credential::KUBECONFIG, s)
        }
    }
}

/// kubelet's kubeconfig once it holds a client certificate
/// ([`kubelet_credential::CURRENT`], the pair it rotates), as its TLS bootstrap writes it:
/// `(path inside the machine, content)`, mode 0600.
pub fn render_certificate_kubeconfig(goal: &MachineGoal) -> (&'static str, String) {
    let mut s = kubeconfig_head(goal);
    let current = kubelet_credential::CURRENT;
    let _ = writeln!(
        s,
        "    client-certificate: {current}\n    client-key: {current}"
    );
    (kubelet_credential::KUBECONFIG, s)
}

/// `entries` for a bootstrap-token machine whose kubelet holds its credential
/// ([`kubelet_credential::keep`]): the token's bootstrap kubeconfig replaced by
/// [`render_certificate_kubeconfig`], so the token is not written into the machine again.
/// Other auth is returned unchanged.
pub fn with_held_credential(mut entries: Vec<Entry>, goal: &MachineGoal) -> Vec<Entry> {
    if !matches!(goal.auth, KubeletAuth::BootstrapToken(_)) {
        return entries;
    }
    let root = goal.machine_dir();
    let bootstrap = root.join(kubelet_credential::BOOTSTRAP_KUBECONFIG.trim_start_matches('/'));
    entries.retain(|e| e.path() != bootstrap);
    let (path, content) = render_certificate_kubeconfig(goal);
    entries.push(file(&root, path, content, 0o600));
    entries
}

fn kubeconfig_head(goal: &MachineGoal) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    certificate-authority: {KUBELET_CA}\n    server: {}\n  name: cluster\ncontexts:\n- context:\n    cluster: cluster\n    user: kubelet\n  name: default\ncurrent-context: default\npreferences: {{}}\nusers:\n- name: kubelet\n  user:\n",
        yaml_str(&goal.api_server)
    )
}

/// Writes `entries`; returns how many changed.
///
/// Entries below the machine's root file system (`/var/lib/machines/<m>/…`) are written
/// through [`HostFs::confined`]: the tree comes from an image, and its symlinks are resolved
/// inside the machine (an absolute link from the machine's root, as the machine sees it; one
/// climbing out of it is an error), never onto the host. The root must exist (the image pull
/// creates it). Host entries (`.nspawn`, drop-in) are written as host paths.
pub fn apply(fs: &HostFs, machine: &str, entries: &[Entry]) -> Result<usize, RenderError> {
    let fs_err = |cause| RenderError::Fs {
        machine: machine.to_string(),
        cause,
    };
    let machine_root = machine_dir(machine);
    let mut rootfs: Option<ConfinedFs> = None;
    let mut changed = 0;
    for e in entries {
        let did = match e.path().strip_prefix(&machine_root) {
            Ok(rel) => {
                let confined = match &rootfs {
                    Some(c) => c,
                    None => rootfs.insert(fs.confined(&machine_root).map_err(fs_err)?),
                };
                apply_one(confined, rel, e)
            }
            Err(_) => apply_one(fs, e.path(), e),
        }
        .map_err(fs_err)?;
        changed += usize::from(did);
    }
    Ok(changed)
}

/// The writes [`apply`] needs, on the host or inside a machine.
trait Writer {
    fn write_if_changed(&self, p: &Path, content: &[u8], mode: u32) -> Result<bool, FsError>;
    fn symlink(&self, p: &Path, target: &Path) -> Result<bool, FsError>;
    fn exists(&self, p: &Path) -> bool;
    fn create_dir_all_mode(&self, p: &Path, mode: u32) -> Result<(), FsError>;
}

macro_rules! writer {
    ($t:ty) => {
        impl Writer for $t {
            fn write_if_changed(&self, p: &Path, c: &[u8], mode: u32) -> Result<bool, FsError> {
                <$t>::write_if_changed(self, p, c, mode)
            }
            fn symlink(&self, p: &Path, target: &Path) -> Result<bool, FsError> {
                <$t>::symlink(self, p, target)
            }
            fn exists(&self, p: &Path) -> bool {
                <$t>::exists(self, p)
            }
            fn create_dir_all_mode(&self, p: &Path, mode: u32) -> Result<(), FsError> {
                <$t>::create_dir_all_mode(self, p, mode)
            }
        }
    };
}
writer!(HostFs);
writer!(ConfinedFs);

/// Writes `e` at `path` (its path as `w` names it); returns whether it changed anything.
fn apply_one(w: &dyn Writer, path: &Path, e: &Entry) -> Result<bool, FsError> {
    Ok(match e {
        Entry::File { content, mode, .. } => w.write_if_changed(path, content, *mode)?,
        Entry::Symlink { target, .. } => w.symlink(path, target)?,
        Entry::Dir { mode, .. } => {
            let existed = w.exists(path);
            w.create_dir_all_mode(path, *mode)?;
            !existed
        }
    })
}

/// Why a value is not standard base64.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    /// Nothing but whitespace.
    #[error("empty")]
    Empty,
    /// Not padded to a multiple of 4.
    #[error("length is not a multiple of 4")]
    Length,
    /// A character outside the alphabet.
    #[error("invalid character {0:?}")]
    Character(char),
}

/// Decodes standard base64 (whitespace ignored).
pub fn decode_base64(s: &str) -> Result<Vec<u8>, Base64Error> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut lookup = [255u8; 256];
    for (i, c) in ALPHABET.iter().enumerate() {
        lookup[*c as usize] = i as u8;
    }
    let clean: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if clean.is_empty() {
        return Err(Base64Error::Empty);
    }
    let body = clean
        .strip_suffix(b"==")
        .or_else(|| clean.strip_suffix(b"="))
        .unwrap_or(&clean);
    if !clean.len().is_multiple_of(4) {
        return Err(Base64Error::Length);
    }
    let mut out = Vec::with_capacity(body.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for &b in body {
        let v = lookup[b as usize];
        if v == 255 {
            return Err(Base64Error::Character(b as char));
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::nodegoal::{HostFacts, resolve};

    fn goal(mutate: impl FnOnce(&mut serde_json::Value)) -> MachineGoal {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/config-token.json")).unwrap();
        mutate(&mut v);
        let c = crate::config::parse(v.to_string().as_bytes(), &|| Ok("h".into()))
            .unwrap()
            .config;
        resolve(
            &c,
            "kube1",
            &HostFacts {
                hostname: "vm-1".into(),
                arch: "amd64".into(),
                present_devices: vec!["/dev/kvm".into()],
                oci_image_env: None,
            },
        )
        .unwrap()
    }

    fn render_all(g: &MachineGoal) -> String {
        let mut entries = render_rootfs(g, b"nameserver 10.0.2.3\n").unwrap();
        entries.extend(render_host(g));
        let mut s = String::new();
        for e in entries {
            match e {
                Entry::File {
                    path,
                    content,
                    mode,
                } => {
                    let _ = writeln!(s, "== {} {mode:04o}", path.display());
                    s.push_str(&String::from_utf8_lossy(&content));
                    if !s.ends_with('\n') {
                        s.push('\n');
                    }
                }
                Entry::Symlink { path, target } => {
                    let _ = writeln!(s, "== {} -> {}", path.display(), target.display());
                }
                Entry::Dir { path, mode } => {
                    let _ = writeln!(s, "== {}/ {mode:04o}", path.display());
                }
            }
        }
        s
    }

    /// Real TOML parser (`toml_edit`): values that would add tables to a template stay one
    /// string in the containerd config and in `hosts.toml`, read back as given. The goal is
    /// changed after the config's checks, which refuse such values first.
    #[test]
    fn hostile_values_stay_strings_in_the_toml_files() {
        let hostile = "x\"\n[plugins.evil]\nkey = \"\\u0041\t\u{7f}";
        let mut g = goal(|_| {});
        g.sandbox_image = hostile.to_string();
        let doc: toml_edit::DocumentMut = render_containerd_config(&g).parse().unwrap();
        let plugins = doc["plugins"].as_table().unwrap();
        assert_eq!(
            plugins["io.containerd.grpc.v1.cri"]["sandbox_image"].as_str(),
            Some(hostile)
        );
        assert!(!plugins.contains_key("evil"));
        let hosts: toml_edit::DocumentMut = render_hosts_toml("r.io", hostile).parse().unwrap();
        assert_eq!(hosts["server"].as_str(), Some("https://r.io"));
        let host = hosts["host"].as_table().unwrap();
        assert_eq!(host.len(), 1);
        assert!(host.contains_key(hostile), "{host}");
        assert_eq!(toml_string("plain"), "\"plain\"");
    }

    #[test]
    fn bootstrap_token_machine_files() {
        insta::assert_snapshot!(render_all(&goal(|_| {})));
    }

    /// Registry mirrors: one `hosts.toml` per registry in the machine's containerd
    /// `config_path`, the mirror first, the registry as the fallback server.
    #[test]
    fn registry_mirrors_render_hosts_toml() {
        let g = goal(|v| {
            v["node"]["registryMirrors"] = serde_json::json!({
                "registry.k8s.io": "http://10.0.2.2:5000",
                "10.0.2.2:5000": "http://10.0.2.2:5000"
            });
        });
        let entries = render_rootfs(&g, b"").unwrap();
        let hosts: Vec<(String, String)> = entries
            .iter()
            .filter_map(|e| match e {
                Entry::File { path, content, .. } if path.ends_with("hosts.toml") => Some((
                    path.display().to_string(),
                    String::from_utf8_lossy(content).into_owned(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(hosts.len(), 2, "{hosts:?}");
        assert_eq!(
            hosts[1].0,
            "/var/lib/machines/kube1/etc/containerd/certs.d/registry.k8s.io/hosts.toml"
        );
        assert_eq!(
            hosts[1].1,
            "# Written by aks-flex-node: node.registryMirrors.\nserver = \"https://registry.k8s.io\"\n\n[host.\"http://10.0.2.2:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        );
        // containerd reads them from the config_path its config names.
        assert!(render_containerd_config(&g).contains("config_path = \"/etc/containerd/certs.d\""));
        // Without mirrors, nothing is written there.
        let none = render_rootfs(&goal(|_| {}), b"").unwrap();
        assert!(
            !none
                .iter()
                .any(|e| matches!(e, Entry::File { path, .. } if path.ends_with("hosts.toml")))
        );
    }

    /// Once kubelet holds its client credential, a bootstrap-token machine gets the
    /// certificate kubeconfig instead of the token's bootstrap kubeconfig: the token is in no
    /// entry. An exec-credential machine is left as it is.
    #[test]
    fn a_held_credential_replaces_the_tokens_kubeconfig() {
        let g = goal(|_| {});
        let token = match &g.auth {
            KubeletAuth::BootstrapToken(t) => t.expose().to_string(),
            other => panic!("{other:?}"),
        };
        let entries = render_rootfs(&g, b"").unwrap();
        let holds_token = |es: &[Entry]| {
            es.iter().any(|e| {
                matches!(e, Entry::File { content, .. }
                    if String::from_utf8_lossy(content).contains(&token))
            })
        };
        assert!(holds_token(&entries));
        let n = entries.len();
        let held = with_held_credential(entries, &g);
        assert_eq!(held.len(), n);
        assert!(!holds_token(&held), "the token is written nowhere");
        let kubeconfig = held
            .iter()
            .find_map(|e| match e {
                Entry::File {
                    path,
                    content,
                    mode,
                } if path.ends_with("var/lib/kubelet/kubeconfig") => {
                    Some((String::from_utf8_lossy(content).into_owned(), *mode))
                }
                _ => None,
            })
            .unwrap();
        assert_eq!(kubeconfig.1, 0o600);
        assert_eq!(kubeconfig.0, render_certificate_kubeconfig(&g).1);
        insta::assert_snapshot!("certificate_kubeconfig", kubeconfig.0);
        assert!(
            !held
                .iter()
                .any(|e| e.path().ends_with("var/lib/kubelet/bootstrap-kubeconfig"))
        );
        let exec = goal(|v| {
            v["azure"].as_object_mut().unwrap().remove("bootstrapToken");
            v["azure"]["servicePrincipal"] =
                serde_json::json!({"tenantId": "t", "clientId": "c", "clientSecret": "s"});
        });
        let entries = render_rootfs(&exec, b"").unwrap();
        assert_eq!(with_held_credential(entries.clone(), &exec), entries);
    }

    /// The service principal's secret is in one file of the machine, 0600 in a 0700
    /// directory, and in no other entry: kubelet's kubeconfig and its image credential provider
    /// config name the file. A bootstrap token with a service principal (the provider only)
    /// gets it too; a managed identity has no secret and no file.
    #[test]
    fn the_service_principals_secret_is_in_its_own_file_only() {
        let sp = serde_json::json!({"tenantId": "tenant-1", "clientId": "client-1", "clientSecret": "s3cret-value"});
        for (what, g) in [
            (
                "exec credential",
                goal(|v| {
                    v["azure"].as_object_mut().unwrap().remove("bootstrapToken");
                    v["azure"]["servicePrincipal"] = sp.clone();
                }),
            ),
            (
                "bootstrap token and a service principal",
                goal(|v| v["azure"]["servicePrincipal"] = sp.clone()),
            ),
        ] {
            let entries = render_rootfs(&g, b"").unwrap();
            let holding: Vec<(&Path, u32)> = entries
                .iter()
                .filter_map(|e| match e {
                    Entry::File {
                        path,
                        content,
                        mode,
                    } if String::from_utf8_lossy(content).contains("s3cret-value") => {
                        Some((path.as_path(), *mode))
                    }
                    _ => None,
                })
                .collect();
            let secret_file = g
                .machine_dir()
                .join("etc/aks-flex-node/azure/client-secret");
            assert_eq!(holding, vec![(secret_file.as_path(), 0o600)], "{what}");
            assert!(
                entries
                    .iter()
                    .any(|e| matches!(e, Entry::Dir { path, mode: 0o700 }
                    if *path == g.machine_dir().join("etc/aks-flex-node/azure"))),
                "{what}"
            );
            let provider = render_credential_provider_config(&g).unwrap();
            assert!(provider.contains(
                "AAD_SERVICE_PRINCIPAL_CLIENT_SECRET_FILE\n    value: \"/etc/aks-flex-node/azure/client-secret\""
            ));
        }
        let msi = goal(|v| {
            v["azure"].as_object_mut().unwrap().remove("bootstrapToken");
            v["azure"]["managedIdentity"] = serde_json::json!({});
        });
        assert!(
            !render_rootfs(&msi, b"")
                .unwrap()
                .iter()
                .any(|e| e.path().ends_with("client-secret"))
        );
    }

    #[test]
    fn exec_credential_and_devices() {
        let g = goal(|v| {
            v["azure"].as_object_mut().unwrap().remove("bootstrapToken");
            v["azure"]["servicePrincipal"] = serde_json::json!({"tenantId": "tenant-1", "clientId": "client-1", "clientSecret": "s3cret"});
            v["bootstrap"] =
                serde_json::json!({"additionalHostDevices": ["char-input", "/dev/fuse"]});
            v["node"]["taints"] = serde_json::json!([]);
            v["node"]["kubelet"]["nodeIP"] = serde_json::json!("");
        });
        let (path, kubeconfig) = render_kubeconfig(&g);
        assert_eq!(path, "/var/lib/kubelet/kubeconfig");
        insta::assert_snapshot!("exec_kubeconfig", kubeconfig);
        insta::assert_snapshot!("override_with_devices", render_override(&g));
        insta::assert_snapshot!("nspawn_with_devices", render_nspawn(&g));
        let node_args = render_node_config_dropin(&g).unwrap();
        assert!(!node_args.contains("--register-with-taints"));
        assert!(!node_args.contains("--node-ip"));
    }

    /// A node with a service principal (and a bootstrap token, and an ACR under another name)
    /// gets kubelet's image credential provider: the config, 0600, with the exec credential's
    /// environment; the flags in their drop-in. A bootstrap token alone gets neither (the
    /// drop-in with an empty value, `bootstrap_token_machine_files`).
    #[test]
    fn a_node_with_an_azure_identity_gets_the_acr_credential_provider() {
        let g = goal(|v| {
            v["azure"]["servicePrincipal"] = serde_json::json!({"tenantId": "tenant-1", "clientId": "client-1", "clientSecret": "s3cret"});
            v["bootstrap"] = serde_json::json!({"registryAuth": {"acrRegistries": ["registry.contoso.example"]}});
        });
        assert!(matches!(g.auth, KubeletAuth::BootstrapToken(_)));
        insta::assert_snapshot!(
            "acr_credential_provider_config",
            render_credential_provider_config(&g).unwrap()
        );
        assert_eq!(
            render_credential_provider_dropin(&g),
            "[Service]\nEnvironment=\"KUBELET_IMAGE_CREDENTIAL_PROVIDER_ARGS=--image-credential-provider-config=/etc/kubernetes/image-credential-provider.yaml --image-credential-provider-bin-dir=/usr/local/bin\"\n"
        );
        let entries = render_rootfs(&g, b"").unwrap();
        let config = entries
            .iter()
            .find(|e| {
                e.path()
                    .ends_with("etc/kubernetes/image-credential-provider.yaml")
            })
            .unwrap();
        assert!(matches!(config, Entry::File { mode: 0o600, .. }));
        let plain = goal(|_| {});
        assert_eq!(render_credential_provider_config(&plain), None);
    }

    /// A goal whose values never went through config validation (faked here by editing a
    /// resolved goal) is refused by rendering, naming the field: the drop-in's kubelet
    /// arguments are word-split by systemd, so a blank would add a flag.
    #[test]
    fn unvalidated_goal_values_are_refused_by_rendering() {
        let evil = " --anonymous-auth=true\nExecStartPre=/bin/touch /tmp/pwned\n#";
        type Mutate = fn(&mut MachineGoal, &str);
        let cases: Vec<(Mutate, &str)> = vec![
            (
                |g, e| {
                    g.labels.insert("evil".into(), e.into());
                },
                "node.labels[\"evil\"]",
            ),
            (
                |g, e| g.taints.push(format!("k=v{e}:NoSchedule")),
                "node.taints[1]",
            ),
            (
                |g, e| g.cluster_dns = format!("10.0.0.10{e}"),
                "networking.dnsServiceIP",
            ),
            (
                |g, e| g.node_ip = format!("10.0.0.4{e}"),
                "node.kubelet.nodeIP",
            ),
            (|g, e| g.node_name = format!("n{e}"), "agent.nodeName"),
        ];
        for (mutate, field) in cases {
            let mut g = goal(|_| {});
            mutate(&mut g, evil);
            let e = render_rootfs(&g, b"").unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    /// The systemd quoting itself: whatever the value, the assignment stays one quoted word
    /// on one line, `%` specifiers are not expanded and C escapes read back the value.
    #[test]
    fn environment_assignments_are_systemd_quoted() {
        assert_eq!(environment("K", "a b"), "Environment=\"K=a b\"\n");
        let e = environment("K", "q\"b\\s%h$X\nExecStartPre=/bin/x\r\x01");
        assert_eq!(
            e,
            "Environment=\"K=q\\\"b\\\\s%%h$X\\nExecStartPre=/bin/x\\r\\x01\"\n"
        );
        assert_eq!(e.matches('\n').count(), 1, "{e}");
    }

    #[test]
    fn bad_ca_is_an_error_naming_the_field() {
        let g = goal(|v| v["node"]["kubelet"]["caCertData"] = serde_json::json!("not base64!"));
        let e = render_rootfs(&g, b"").unwrap_err().to_string();
        assert!(e.contains("node.kubelet.caCertData"), "{e}");
    }

    #[test]
    fn base64_decoding() {
        assert_eq!(decode_base64("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(decode_base64("aGVsbG8h").unwrap(), b"hello!");
        assert_eq!(decode_base64("aGk=\n").unwrap(), b"hi");
        assert_eq!(decode_base64("aGk"), Err(Base64Error::Length));
        assert_eq!(decode_base64("a$k="), Err(Base64Error::Character('$')));
        assert_eq!(decode_base64(" \n"), Err(Base64Error::Empty));
    }

    /// Real files under a temporary host root, nothing faked: a machine image whose
    /// `etc/systemd/system` is an absolute symlink to a host directory (here `<tmp>/outside`,
    /// standing for the host's `/etc/systemd/system`). The units, drop-ins and the masks of
    /// systemd-resolved/udevd land inside the machine (the link resolved as in a chroot), never
    /// in the host directory.
    #[test]
    fn apply_resolves_absolute_image_symlinks_inside_the_machine() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let machine = fs.path(Path::new("/var/lib/machines/kube1"));
        let outside = d.path().join("outside");
        std::fs::create_dir_all(machine.join("etc/systemd")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, machine.join("etc/systemd/system")).unwrap();
        let g = goal(|_| {});
        let entries = render_rootfs(&g, b"nameserver 1.1.1.1\n").unwrap();
        apply(&fs, "kube1", &entries).unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "wrote onto the host"
        );
        let inside = machine.join(outside.strip_prefix("/").unwrap());
        assert!(inside.join("kubelet.service").is_file());
        assert_eq!(
            std::fs::read_link(inside.join("systemd-resolved.service")).unwrap(),
            PathBuf::from("/dev/null")
        );
        // The link itself is the image's, untouched.
        assert_eq!(
            std::fs::read_link(machine.join("etc/systemd/system")).unwrap(),
            outside
        );
    }

    /// Real files, nothing faked: a relative symlink that climbs out of the machine root
    /// (`var/lib/kubelet -> ../../../../../../outside`, which leads to `<tmp>/outside` from
    /// `<tmp>/var/lib/machines/kube1`) is refused; nothing is written through it.
    #[test]
    fn apply_refuses_relative_image_symlinks_that_leave_the_machine() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let machine = fs.path(Path::new("/var/lib/machines/kube1"));
        let outside = d.path().join("outside");
        std::fs::create_dir_all(machine.join("var/lib")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink("../../../../../../outside", machine.join("var/lib/kubelet"))
            .unwrap();
        assert!(
            machine.join("var/lib/kubelet").is_dir(),
            "the link leads out"
        );
        let g = goal(|_| {});
        let entries = render_rootfs(&g, b"nameserver 1.1.1.1\n").unwrap();
        let e = apply(&fs, "kube1", &entries).unwrap_err().to_string();
        assert!(e.contains("escapes"), "{e}");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "wrote onto the host"
        );
    }

    #[test]
    fn apply_writes_once_then_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let fs = HostFs::new(d.path());
        let g = goal(|_| {});
        let mut entries = render_rootfs(&g, b"nameserver 1.1.1.1\n").unwrap();
        entries.extend(render_host(&g));
        // The image pull creates the machine's root; apply does not.
        let e = apply(&fs, "kube1", &entries).unwrap_err().to_string();
        assert!(
            e.starts_with("machine kube1: open /var/lib/machines/kube1:"),
            "{e}"
        );
        fs.create_dir_all(&g.machine_dir()).unwrap();
        let n = apply(&fs, "kube1", &entries).unwrap();
        assert_eq!(n, entries.len());
        assert_eq!(apply(&fs, "kube1", &entries).unwrap(), 0);
        assert_eq!(
            fs.mode(Path::new(
                "/var/lib/machines/kube1/var/lib/kubelet/bootstrap-kubeconfig"
            )),
            Some(0o600)
        );
        assert_eq!(
            std::fs::read_link(fs.path(Path::new(
                "/var/lib/machines/kube1/etc/systemd/system/systemd-resolved.service"
            )))
            .unwrap(),
            PathBuf::from("/dev/null")
        );
    }
}
