from omnidraft.core import paths


def test_everything_lives_under_omnidraft_home(home):
    for root in paths.all_roots():
        assert root.is_dir()
        assert root.is_relative_to(home)
