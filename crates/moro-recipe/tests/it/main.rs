//! Integration tests of moro-recipe: one binary, a module per concern.

mod fuzz;
mod job;
mod parse;
mod pyyaml;
#[cfg(feature = "schema")]
mod schema;
mod write;

/// The product's moro.yaml example (issue 2 §5), verbatim.
pub const PRODUCT: &str = include_str!("../fixtures/product.yaml");
/// A recipe with every section and field.
pub const FULL: &str = include_str!("../fixtures/full.yaml");

/// Parses or fails the test with the error's message.
#[track_caller]
pub fn ok(text: &str) -> moro_recipe::Recipe {
    match moro_recipe::parse(text) {
        Ok(r) => r,
        Err(e) => panic!("expected a valid recipe, got: {e}\n{text}"),
    }
}

/// Parses and expects an error.
#[track_caller]
pub fn err(text: &str) -> moro_recipe::RecipeError {
    match moro_recipe::parse(text) {
        Ok(r) => panic!("expected an error, got {r:?}\n{text}"),
        Err(e) => {
            let s = e.to_string();
            assert!(!s.contains('\n'), "error message spans lines: {s:?}");
            e
        }
    }
}
