//! AFL++ target: see `sluice_fuzz::client_message` for what must hold.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        if let Ok(text) = std::str::from_utf8(data) {
            sluice_fuzz::client_message(text);
        }
    });
}
