"""The launcher's reading of mpirun's --tag-output stream: each rank's line once, tagged once."""
from kvhybrid.launch.supervisor import TaggedLines


def test_pieces_of_two_ranks_become_each_ranks_lines():
    # print("rank", r) unbuffered on ranks 0 and 1: "rank", " ", "0", "\n" tagged apiece; a
    # stream line ends where a rank wrote its newline
    lines = TaggedLines()
    got = lines.feed("[1,0]<stdout>:rank[1,1]<stdout>:rank[1,0]<stdout>: [1,0]<stdout>:0"
                     "[1,0]<stdout>:")
    got += lines.feed("[1,1]<stdout>: [1,1]<stdout>:1[1,1]<stdout>:")
    assert got == ["[1,0]<stdout>:rank 0", "[1,1]<stdout>:rank 1"]


def test_untagged_lines_pass_and_an_unfinished_line_comes_at_the_end():
    lines = TaggedLines()
    assert lines.feed("mpirun noticed that process rank 1 exited") == \
        ["mpirun noticed that process rank 1 exited"]
    assert lines.feed("[1,0]<stderr>:a") == ["[1,0]<stderr>:a"]
    assert lines.feed("[1,0]<stdout>:b\tc[1,0]<stderr>:e") == ["[1,0]<stderr>:e"]
    assert lines.rest() == ["[1,0]<stdout>:b\tc"]
    assert lines.rest() == []
