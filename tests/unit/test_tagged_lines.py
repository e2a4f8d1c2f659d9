"""The launcher's reading of mpirun's --tag-output stream: each rank's line once, tagged once."""
from kvhybrid.launch.mpirun import MpiImplementation, output_tag
from kvhybrid.launch.supervisor import TaggedLines

OPEN_MPI = output_tag(MpiImplementation("openmpi", (4, 1, 4)))
OPEN_MPI_5 = output_tag(MpiImplementation("openmpi", (5, 0, 11)))
HYDRA = output_tag(MpiImplementation("mpich", (5, 0, 2)))


def test_pieces_of_two_ranks_become_each_ranks_lines():
    # print("rank", r) unbuffered on ranks 0 and 1: "rank", " ", "0", "\n" tagged apiece; a
    # stream line ends where a rank wrote its newline
    lines = TaggedLines(OPEN_MPI)
    got = lines.feed("[1,0]<stdout>:rank[1,1]<stdout>:rank[1,0]<stdout>: [1,0]<stdout>:0"
                     "[1,0]<stdout>:")
    got += lines.feed("[1,1]<stdout>: [1,1]<stdout>:1[1,1]<stdout>:")
    assert got == ["[1,0]<stdout>:rank 0", "[1,1]<stdout>:rank 1"]


def test_open_mpi_5s_tags_with_their_space():
    lines = TaggedLines(OPEN_MPI_5)
    assert lines.feed("[1,0]<stdout>: rank[1,0]<stdout>:  [1,0]<stdout>: 0[1,0]<stdout>: ") == \
        ["[1,0]<stdout>: rank 0"]


def test_hydras_prepended_ranks_too():
    # MPICH's and Intel MPI's -prepend-rank put "[r] " before each piece they read
    lines = TaggedLines(HYDRA)
    assert lines.feed("[1] rank[0] rank[1]  1 line 0") == ["[1] rank 1 line 0"]
    assert lines.feed("[0]  0 line 0") == ["[0] rank 0 line 0"]


def test_a_process_that_does_not_tag_passes_as_it_is():
    assert TaggedLines(None).feed("[1,0]<stdout>:a[1,1]<stdout>:b") == \
        ["[1,0]<stdout>:a[1,1]<stdout>:b"]


def test_untagged_lines_pass_and_an_unfinished_line_comes_at_the_end():
    lines = TaggedLines(OPEN_MPI)
    assert lines.feed("mpirun noticed that process rank 1 exited") == \
        ["mpirun noticed that process rank 1 exited"]
    assert lines.feed("[1,0]<stderr>:a") == ["[1,0]<stderr>:a"]
    assert lines.feed("[1,0]<stdout>:b\tc[1,0]<stderr>:e") == ["[1,0]<stderr>:e"]
    assert lines.rest() == ["[1,0]<stdout>:b\tc"]
    assert lines.rest() == []
