//! The registry directory: add, replace and remove without a restart; bad plugins are
//! reported and never fatal; the component cache lives only in the state directory.

use std::sync::Arc;
use std::time::Duration;

use dspark_host::plugin::registry::{EntryState, Registry};
use dspark_host::plugin::{PluginRuntime, RuntimeConfig};
use dspark_tests::{Fixture, builtin_plugin, install, test_plugin};

fn set_manifest_field(dir: &std::path::Path, key: &str, value: &str) {
    let path = dir.join("plugin.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let out: Vec<String> = text
        .lines()
        .map(|l| if l.starts_with(&format!("{key} = ")) { format!("{key} = {value}") } else { l.to_string() })
        .collect();
    std::fs::write(&path, out.join("\n")).unwrap();
}

#[test]
fn scan_adds_replaces_and_removes() {
    let f = Fixture::new(&[builtin_plugin("regex")], |_| {});
    assert_eq!(f.registry.list().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), vec!["regex"]);

    install(&builtin_plugin("choice"), f.plugins.path());
    let r = f.registry.scan();
    assert_eq!(r.added, vec!["choice"]);
    assert!(r.replaced.is_empty() && r.removed.is_empty() && r.failed.is_empty());
    assert_eq!(f.registry.find_kind("choice").unwrap().name(), "choice");

    // Nothing changed: nothing reloaded.
    assert_eq!(f.registry.scan(), Default::default());

    let before = f.registry.get("regex").unwrap();
    set_manifest_field(&f.plugins.path().join("regex"), "version", "\"0.1.1\"");
    let r = f.registry.scan();
    assert_eq!(r.replaced, vec!["regex"]);
    let after = f.registry.get("regex").unwrap();
    assert_eq!(after.manifest.version, "0.1.1");
    assert_eq!(before.manifest.version, "0.1.0", "holders of the old plugin keep it");

    std::fs::remove_dir_all(f.plugins.path().join("choice")).unwrap();
    assert_eq!(f.registry.scan().removed, vec!["choice"]);
    assert!(f.registry.get("choice").is_none());
}

#[test]
fn bad_plugins_are_reported_and_the_rest_load() {
    let f = Fixture::new(&[builtin_plugin("regex")], |_| {});
    let dir = f.plugins.path();

    let wrong_sha = install(&builtin_plugin("choice"), dir);
    set_manifest_field(&wrong_sha, "sha256", &format!("\"{}\"", "0".repeat(64)));

    let garbage = dir.join("garbage");
    std::fs::create_dir_all(&garbage).unwrap();
    std::fs::write(garbage.join("plugin.wasm"), b"\0asm not really").unwrap();
    let sha = {
        use std::process::Command;
        let out = Command::new("sha256sum").arg(garbage.join("plugin.wasm")).output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    };
    std::fs::write(
        garbage.join("plugin.toml"),
        format!("name = \"garbage\"\nversion = \"1\"\nwit = \"dspark:constraint@0.1.0\"\nkinds = [\"x\"]\nsha256 = \"{sha}\"\n"),
    )
    .unwrap();

    let lying = install(&test_plugin("testkit"), dir);
    set_manifest_field(&lying, "kinds", "[\"bitset\"]");

    let future = dir.join("future");
    std::fs::create_dir_all(&future).unwrap();
    std::fs::write(
        future.join("plugin.toml"),
        "name = \"future\"\nversion = \"1\"\nwit = \"dspark:constraint@9.0.0\"\nkinds = [\"x\"]\nsha256 = \"00\"\n",
    )
    .unwrap();

    let r = f.registry.scan();
    let failed: std::collections::BTreeMap<_, _> = r.failed.into_iter().collect();
    assert_eq!(failed.len(), 4, "{failed:?}");
    assert!(
        failed["choice"].contains("plugin.wasm has sha256") && failed["choice"].contains("the manifest says 0000"),
        "{}",
        failed["choice"]
    );
    assert!(failed["garbage"].contains("does not compile"), "{}", failed["garbage"]);
    assert!(
        failed["testkit"].contains("declares kinds [\"bitset\"] but the component serves"),
        "{}",
        failed["testkit"]
    );
    assert!(
        failed["future"].contains("targets `dspark:constraint@9.0.0`; this host supports dspark:constraint@0.1.0"),
        "{}",
        failed["future"]
    );
    assert!(matches!(f.registry.state("regex"), Some(EntryState::Loaded(_))));
    let statuses: Vec<String> =
        f.registry.list().into_iter().map(|p| format!("{} {}", p.name, p.status.split(':').next().unwrap())).collect();
    assert_eq!(statuses, vec!["choice failed", "future failed", "garbage failed", "regex ready", "testkit failed"]);
}

#[test]
fn a_bad_update_keeps_the_last_good_version_serving() {
    let f = Fixture::new(&[builtin_plugin("regex")], |_| {});
    let dir = f.plugins.path().join("regex");
    let good = std::fs::read_to_string(dir.join("plugin.toml")).unwrap();
    let serving = f.registry.get("regex").unwrap();

    // An update whose manifest no longer matches its component is refused ...
    set_manifest_field(&dir, "sha256", &format!("\"{}\"", "0".repeat(64)));
    let r = f.registry.scan();
    assert_eq!(r.kept_previous, vec!["regex"]);
    assert_eq!(r.failed.len(), 1);
    // ... and the version that worked keeps serving, saying the update was refused and why.
    assert!(Arc::ptr_eq(&f.registry.find_kind("regex").unwrap(), &serving));
    let summary = &f.registry.list()[0];
    assert_eq!(summary.status, "ready");
    let why = summary.update_error.as_deref().expect("the refused update is reported");
    assert!(why.contains("plugin.wasm has sha256") && why.contains("the manifest says 0000"), "{why}");
    // The same files are not retried every scan.
    assert_eq!(f.registry.scan(), Default::default());

    // A good update replaces it and clears the report.
    std::fs::write(dir.join("plugin.toml"), good.replace("version = \"0.1.0\"", "version = \"0.1.1\"")).unwrap();
    let r = f.registry.scan();
    assert_eq!(r.replaced, vec!["regex"]);
    assert!(r.failed.is_empty());
    assert_eq!(f.registry.get("regex").unwrap().manifest.version, "0.1.1");
    assert_eq!(f.registry.list()[0].update_error, None);
}

/// Compiled components are native code loaded without compiling: their directory must be this
/// user's own and closed to others.
#[test]
fn the_state_directory_is_closed_to_other_users() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    drop(PluginRuntime::new(RuntimeConfig::new(&state)).unwrap());
    for d in [state.clone(), state.join("components"), state.join("quarantine")] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o022, 0, "{} is writable by others: {mode:o}", d.display());
    }
    assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);

    // A directory of another user is refused (only root can make one to try it with).
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    match std::os::unix::fs::chown(&theirs, Some(4242), None) {
        Ok(()) => {
            let e = PluginRuntime::new(RuntimeConfig::new(&theirs)).err().expect("refused");
            assert!(format!("{e:#}").contains("belongs to another user (uid 4242"), "{e:#}");
        }
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "only a lack of rights may stop this check")
        }
    }
}

#[test]
fn watch_picks_up_a_new_plugin_without_a_restart() {
    let f = Fixture::new(&[], |_| {});
    let (tx, rx) = std::sync::mpsc::channel();
    let _guard = f.registry.watch(Duration::from_millis(50), move |r| {
        let _ = tx.send(r.clone());
    });
    install(&builtin_plugin("choice"), f.plugins.path());
    let report = rx.recv_timeout(Duration::from_secs(60)).expect("the watcher rescans");
    assert_eq!(report.added, vec!["choice"]);
    assert!(f.registry.find_kind("choice").is_some());
}

#[test]
fn components_are_cached_in_the_state_directory_only() {
    let f = Fixture::new(&[builtin_plugin("regex")], |_| {});
    let cached: Vec<_> =
        std::fs::read_dir(f.state.path().join("components")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(cached.len(), 1);
    let sha = f.registry.get("regex").unwrap().sha256.clone();
    assert!(cached[0].to_string_lossy().starts_with(&sha), "{cached:?}");
    // A second runtime over the same state directory loads from the cache.
    let runtime = PluginRuntime::new(RuntimeConfig::new(f.state.path())).unwrap();
    let again = runtime.load(&f.plugins.path().join("regex")).unwrap();
    assert_eq!(again.sha256, sha);
    // A state directory inside the plugin directory is refused.
    let inside = RuntimeConfig::new(f.plugins.path().join(".state"));
    let runtime = PluginRuntime::new(inside).unwrap();
    let err = Registry::new(f.plugins.path(), runtime).err().expect("refused");
    assert!(err.to_string().contains("is inside the plugin directory"), "{err}");
}
