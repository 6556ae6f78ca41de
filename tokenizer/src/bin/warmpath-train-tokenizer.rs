//! Writes the built-in tokenizer (`tokenizer.json`, `tokenizer_config.json`) into a directory.
//! Run through `cargo xtask gen-tokenizer`.

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: warmpath-train-tokenizer DIR")?;
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir)?;
    let (json, config) = warmpath_tokenizer::train::train_default()?;
    std::fs::write(dir.join("tokenizer.json"), json)?;
    std::fs::write(dir.join("tokenizer_config.json"), config)?;
    println!("wrote {}", dir.display());
    Ok(())
}
