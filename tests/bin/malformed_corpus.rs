//! `malformed-corpus DIR`: writes the malformed-file corpus as a data root (`healthy/` and
//! one `bad_<name>/` dataset per entry) and prints one JSON line per entry.

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: malformed-corpus DIR");
        std::process::exit(2);
    };
    let root = std::path::PathBuf::from(dir);
    for entry in pushdown_tests::malformed::write_corpus(&root) {
        println!(
            "{{\"name\": \"{}\", \"pages_only\": {}, \"defect\": \"{}\"}}",
            entry.name, entry.pages_only, entry.defect
        );
    }
}
