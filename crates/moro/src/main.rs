//! The `moro` command line.

fn main() {
    println!("moro");
}
