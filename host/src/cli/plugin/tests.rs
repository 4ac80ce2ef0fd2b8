use super::*;
use std::path::Path;

/// The embedded templates are the files each FILES.txt lists, plus the
/// SDK and the WIT.
#[test]
fn templates_are_what_files_txt_lists() {
    for (lang, dir) in [
        (Lang::Rust, "rust"),
        (Lang::Python, "python"),
        (Lang::Js, "js"),
        (Lang::C, "c"),
    ] {
        let listed = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../sdk/{dir}/template/FILES.txt")),
        )
        .unwrap();
        for f in listed.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                template(lang).iter().any(|(d, _)| *d == f.trim()),
                "{dir}: {f} is in FILES.txt but not in the binary"
            );
        }
        assert!(template(lang)
            .iter()
            .any(|(d, _)| d.ends_with("herald.wit")));
    }
}

#[test]
fn new_refuses_a_folder_with_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x"), "keep me").unwrap();
    let e = new(&NewArgs {
        lang: Lang::C,
        dir: dir.path().to_path_buf(),
    })
    .unwrap_err();
    assert!(e.to_string().contains("not empty"), "{e}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("x")).unwrap(),
        "keep me"
    );
}
