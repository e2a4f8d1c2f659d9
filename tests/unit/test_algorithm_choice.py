"""Which algorithm auto settles on from its trials (algorithms.pick): the fastest, except
on a patient group, whose sums share the cores with MXNet's compute: there the cheapest in
CPU of those about as fast. The trials themselves run on real ranks:
tests/mpi/test_algorithms.py."""
from kvhybrid.tensor_collectives.algorithms import TIE, pick

CANDIDATES = ["mpi", "ring", "hierarchical"]


def test_a_blocking_group_takes_the_fastest_whatever_it_burns():
    assert pick(CANDIDATES, [36.0, 53.0, 37.0], [20.0, 9.0, 8.0], patient=False) == "mpi"


def test_a_patient_group_takes_the_cheapest_of_those_about_as_fast():
    # two emulated hosts at 1 Gbit/s, a 4 MB bucket: MPI's call spins on the link
    assert pick(CANDIDATES, [36.0, 53.0, 37.0], [20.0, 9.0, 8.0], patient=True) == "hierarchical"
    # ring is the cheapest of all, but not about as fast
    assert pick(CANDIDATES, [36.0, 36.0 * TIE * 1.01, 37.0], [20.0, 1.0, 8.0],
                patient=True) == "hierarchical"


def test_a_patient_group_keeps_the_fastest_when_it_is_also_the_cheapest_near_it():
    assert pick(CANDIDATES, [30.0, 53.0, 37.0], [20.0, 9.0, 8.0], patient=True) == "mpi"
    # equal CPU: the faster of the two
    assert pick(CANDIDATES, [36.0, 37.0, 36.5], [8.0, 8.0, 9.0], patient=True) == "mpi"
