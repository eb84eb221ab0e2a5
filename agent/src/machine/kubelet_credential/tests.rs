//! kubelet's credential kept across provisions: real pair files (rcgen keys and certificates)
//! in machine root file systems under a temporary directory, through the real confined file
//! system. Nothing is faked.

use super::*;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

/// A pair file as kubelet writes it (key, then certificate) for `cn`, valid until
/// `not_after` (year, month, day).
fn pair(cn: &str, not_after: (i32, u8, u8)) -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "system:nodes");
    params.distinguished_name = dn;
    params.not_before = rcgen::date_time_ymd(2026, 1, 1);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let cert = params.self_signed(&key).unwrap().pem();
    format!("{}{cert}", key.serialize_pem())
}

fn at(date: &str) -> SystemTime {
    let t: k8s_openapi::jiff::Timestamp = date.parse().unwrap();
    SystemTime::from(t)
}

/// A host with both machines' root file systems; `kubelet_pki(m)` is machine m's pki dir.
fn host() -> (tempfile::TempDir, HostFs) {
    let t = tempfile::tempdir().unwrap();
    let fs = HostFs::new(t.path());
    for m in nspawn::MACHINES {
        std::fs::create_dir_all(
            t.path()
                .join(format!("var/lib/machines/{m}/var/lib/kubelet")),
        )
        .unwrap();
    }
    (t, fs)
}

fn machine_path(t: &tempfile::TempDir, m: &str, p: &str) -> PathBuf {
    t.path()
        .join(format!("var/lib/machines/{m}"))
        .join(p.trim_start_matches('/'))
}

/// As kubelet's certificate store lays it out: a dated pair file and the `current` link to it
/// (absolute, from the machine's root).
fn kubelet_wrote(t: &tempfile::TempDir, m: &str, text: &str) {
    let dated = "/var/lib/kubelet/pki/kubelet-client-2026-06-01-00-00-00.pem";
    std::fs::create_dir_all(machine_path(t, m, PKI_DIR)).unwrap();
    std::fs::write(machine_path(t, m, dated), text).unwrap();
    std::os::unix::fs::symlink(dated, machine_path(t, m, CURRENT)).unwrap();
}

#[test]
fn usable_table() {
    // Half an hour before the end of 2026-05-31.
    let now = at("2026-05-31T23:30:00Z");
    let good = pair("system:node:node1", (2027, 6, 1));
    assert!(usable(&good, "node1", now).is_ok());
    let cases: Vec<(&str, String, &str)> = vec![
        ("another node's", good.clone(), "node2"),
        ("expired", pair("system:node:node1", (2026, 5, 1)), "node1"),
        (
            "ending within the hour",
            pair("system:node:node1", (2026, 6, 1)),
            "node1",
        ),
        (
            "no key",
            good[good.find("-----BEGIN CERTIFICATE").unwrap()..].to_string(),
            "node1",
        ),
        ("not PEM", "garbage".to_string(), "node1"),
    ];
    let want = [
        "the certificate is for \"system:node:node1\", not \"system:node:node2\"",
        "the certificate has expired",
        "the certificate expires within 3600s",
        "no private key in it",
        "no private key in it",
    ];
    for ((name, text, node), want) in cases.into_iter().zip(want) {
        let e = usable(&text, node, now).unwrap_err().to_string();
        assert_eq!(e, want, "{name}");
    }
    // A key that is not the certificate's: kubelet could not use the pair.
    let other = pair("system:node:node1", (2027, 6, 1));
    let cert_at = |t: &str| t.find("-----BEGIN CERTIFICATE").unwrap();
    let mismatched = format!("{}{}", &other[..cert_at(&other)], &good[cert_at(&good)..]);
    assert_eq!(
        usable(&mismatched, "node1", now).unwrap_err().to_string(),
        "the certificate is not for the stored key"
    );
    // Not valid yet.
    assert_eq!(
        usable(&good, "node1", at("2025-12-31T00:00:00Z"))
            .unwrap_err()
            .to_string(),
        "the certificate is not valid yet"
    );
}

/// kubelet writes its key in SEC1 form (`EC PRIVATE KEY`); such a pair is usable, and the
/// same certificate with another key is not. The fixture was made with openssl
/// (`fixtures/README.md`).
#[test]
fn a_pair_as_kubelet_writes_it_is_usable() {
    let sec1 = include_str!("fixtures/kubelet-pair-sec1.pem");
    assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let now = at("2027-06-01T00:00:00Z");
    usable(sec1, "node1", now).unwrap();
    let other_key = pair("system:node:node1", (2027, 6, 1));
    let swapped = format!(
        "{}{}",
        &other_key[..other_key.find("-----BEGIN CERTIFICATE").unwrap()],
        &sec1[sec1.find("-----BEGIN CERTIFICATE").unwrap()..]
    );
    assert!(matches!(
        usable(&swapped, "node1", now),
        Err(Unusable::Pair(PairError::WrongKey))
    ));
}

/// The first join: neither machine holds a credential, so nothing is kept and kubelet
/// bootstraps with the token.
#[test]
fn a_first_join_keeps_nothing() {
    let (_t, fs) = host();
    let kept = keep(&fs, "kube1", "node1", at("2026-06-01T00:00:00Z")).unwrap();
    assert_eq!(kept, Kept::Nothing("kube1: none; kube2: none".into()));
    assert!(!kept.holds());
}

/// A repave to kube2: kube1's kubelet credential (a dated file behind kubelet's link) is
/// copied into kube2 as kubelet's store lays it out, 0600, and kube2's own stale one does not
/// count.
#[test]
fn a_repave_carries_the_other_machines_credential() {
    use std::os::unix::fs::PermissionsExt as _;
    let (t, fs) = host();
    let now = at("2026-06-01T00:00:00Z");
    let current = pair("system:node:node1", (2027, 6, 1));
    kubelet_wrote(&t, "kube1", &current);
    std::fs::create_dir_all(machine_path(&t, "kube2", PKI_DIR)).unwrap();
    std::fs::write(
        machine_path(&t, "kube2", CURRENT),
        pair("system:node:node1", (2026, 5, 1)),
    )
    .unwrap();
    let kept = keep(&fs, "kube2", "node1", now).unwrap();
    assert_eq!(
        kept,
        Kept::Carried {
            from: "kube1".into()
        }
    );
    let carried = machine_path(&t, "kube2", CARRIED);
    assert_eq!(std::fs::read_to_string(&carried).unwrap(), current);
    assert_eq!(
        std::fs::metadata(&carried).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read_link(machine_path(&t, "kube2", CURRENT)).unwrap(),
        PathBuf::from(CARRIED),
        "a link, as kubelet's store needs to rotate"
    );
    // Provisioned again (a restart): kube2 keeps its own now.
    assert_eq!(keep(&fs, "kube2", "node1", now).unwrap(), Kept::Own);
}

/// A credential for another node, or one that ends within the hour, is not carried; one whose
/// link leads out of the machine is not read (the confined file system refuses it).
#[test]
fn what_is_not_the_nodes_is_not_carried() {
    let now = at("2026-06-01T00:00:00Z");
    let (t, fs) = host();
    kubelet_wrote(&t, "kube1", &pair("system:node:node9", (2027, 6, 1)));
    let kept = keep(&fs, "kube2", "node1", now).unwrap();
    assert!(
        matches!(&kept, Kept::Nothing(w) if w.contains("kube1: the certificate is for \"system:node:node9\"")),
        "{kept:?}"
    );
    assert!(!machine_path(&t, "kube2", CARRIED).exists());

    let (t, fs) = host();
    let outside = t.path().join("outside.pem");
    std::fs::write(&outside, pair("system:node:node1", (2027, 6, 1))).unwrap();
    std::fs::create_dir_all(machine_path(&t, "kube1", PKI_DIR)).unwrap();
    // Relative, climbing out of the machine's root.
    std::os::unix::fs::symlink(
        "../../../../../../../outside.pem",
        machine_path(&t, "kube1", CURRENT),
    )
    .unwrap();
    let kept = keep(&fs, "kube2", "node1", now).unwrap();
    assert!(
        matches!(&kept, Kept::Nothing(w) if w.contains("kube1: ") && w.contains("escapes")),
        "{kept:?}"
    );
    // The same link in the machine being provisioned: none kept, the provision goes on.
    let kept = keep(&fs, "kube1", "node1", now).unwrap();
    assert!(
        matches!(&kept, Kept::Nothing(w) if w.starts_with("kube1: ") && w.contains("escapes")),
        "{kept:?}"
    );
    assert!(!scrub_token(&fs, "kube1", "node1", now).unwrap());
}

/// After the first join kubelet holds its credential and the token's kubeconfig goes; without
/// one it stays (kubelet still needs it).
#[test]
fn the_token_leaves_the_machine_once_kubelet_holds_its_credential() {
    let now = at("2026-06-01T00:00:00Z");
    let (t, fs) = host();
    let bootstrap = machine_path(&t, "kube1", BOOTSTRAP_KUBECONFIG);
    std::fs::write(&bootstrap, "token: abcdef.0123456789abcdef").unwrap();
    assert!(!scrub_token(&fs, "kube1", "node1", now).unwrap());
    assert!(bootstrap.exists(), "kubelet has not joined yet");
    kubelet_wrote(&t, "kube1", &pair("system:node:node1", (2027, 6, 1)));
    assert!(scrub_token(&fs, "kube1", "node1", now).unwrap());
    assert!(!bootstrap.exists());
    assert!(!scrub_token(&fs, "kube1", "node1", now).unwrap(), "once");
}
