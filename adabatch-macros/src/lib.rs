use proc_macro::TokenStream; #[proc_macro_attribute] pub fn adaptive_trainer(_a: TokenStream, i: TokenStream) -> TokenStream { i }
