//! `hlat --help` says what the command line does today: its first line names every command it
//! lists, and `hlat merge --help` every merge method.

use hlat::merge::MergeMethod;

use super::succeed;

#[test]
fn the_help_names_every_command_and_every_merge_method() {
    let help = succeed(&["--help"]);
    let first = help.lines().next().unwrap();
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .and_then(|rest| rest.split("Options:").next())
        .unwrap()
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    assert!(commands.len() >= 11, "{help}");
    for command in commands {
        assert!(first.contains(command), "`{command}` missing from: {first}");
    }
    let merge = succeed(&["merge", "--help"]);
    for method in MergeMethod::ALL {
        assert!(merge.contains(method.name()), "{}: {merge}", method.name());
    }
}
