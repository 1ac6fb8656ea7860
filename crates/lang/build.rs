//! Generates the LALR parser from `src/grammar.lalrpop` into OUT_DIR.
fn main() {
    lalrpop::process_src().expect("lalrpop failed to generate the parser");
    println!("cargo:rerun-if-changed=src/grammar.lalrpop");
}
