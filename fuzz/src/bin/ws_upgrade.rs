//! AFL++ target: see `sluice_fuzz::ws_upgrade` for what must hold.
fn main() {
    afl::fuzz!(|data: &[u8]| {
        sluice_fuzz::ws_upgrade(data);
    });
}
